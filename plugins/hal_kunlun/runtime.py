"""The Kunlun device runtime: torch.cuda of KunlunXin's CUDA-compatible PyTorch build.

Streams, events, memory statistics and device selection are torch.cuda's (the build maps them onto
the XPU runtime); the device name prefers torch_xmlir's own report over torch.cuda's.
"""
from __future__ import annotations

import importlib
from typing import Any, Optional

import torch

import hal

from .probe import ADAPTER, adapter_device_name


class KunlunRuntime(hal.TorchDeviceRuntime):
    def __init__(self, module: Any = None, device_type: str = "cuda"):
        super().__init__(module if module is not None else torch.cuda, device_type)

    def device_name(self, index: Optional[int] = None) -> str:
        index = self.current_device_index() if index is None else index
        return adapter_device_name(importlib.import_module(ADAPTER), index) or self.module.get_device_name(index)

    def pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if tensor.is_pinned() else tensor.pin_memory()
