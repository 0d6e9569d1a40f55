"""The Kunlun device runtime: torch.cuda of KunlunXin's CUDA-compatible PyTorch build.

Streams, events, memory statistics and device selection are torch.cuda's (the build maps them onto
the XPU runtime), as in hal_cuda's runtime; the device name prefers torch_xmlir's own report over
torch.cuda's.
"""
from __future__ import annotations

import importlib
from typing import Any, Optional

from hal_cuda import CudaRuntime

from .probe import ADAPTER, adapter_device_name


class KunlunRuntime(CudaRuntime):
    def __init__(self, module: Any = None, device_type: str = "cuda"):
        super().__init__(module, device_type, visible_devices_env="XPU_VISIBLE_DEVICES")

    def device_name(self, index: Optional[int] = None) -> str:
        index = self.current_device_index() if index is None else index
        return adapter_device_name(importlib.import_module(ADAPTER), index) or self.module.get_device_name(index)
