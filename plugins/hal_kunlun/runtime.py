"""The Kunlun device runtime: torch.cuda of KunlunXin's CUDA-compatible PyTorch build.

Streams, events, memory statistics and device selection are torch.cuda's (the build maps them onto
the XPU runtime), as in hal_cuda's runtime; the device name prefers torch_xmlir's own report over
torch.cuda's. The constructor touches no device; the accelerator asks `device_name()` only after it
selected this rank's device (hal.core.selection), and that is where a device reporting an NVIDIA
name is refused (`ChipUnavailableError`), so only the selected device is ever asked.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Optional

from hal import sdk
from hal_cuda import CudaRuntime

from .probe import ADAPTER, adapter_device_name, is_nvidia_name


class KunlunRuntime(CudaRuntime):
    def __init__(self, module: Any = None, device_type: str = "cuda",
                 on_name: Optional[Callable[[int, str], None]] = None):
        super().__init__(module, device_type, visible_devices_env="XPU_VISIBLE_DEVICES")
        self._on_name = on_name  # told each name read (the chip keeps it for the profile's notes)

    def device_name(self, index: Optional[int] = None) -> str:
        index = self.current_device_index() if index is None else index
        name = adapter_device_name(importlib.import_module(ADAPTER), index) or self.module.get_device_name(index)
        if self._on_name is not None:
            self._on_name(index, name)
        if is_nvidia_name(name):
            raise sdk.ChipUnavailableError(
                f"plugin 'kunlun': {ADAPTER} is installed but the selected device {index} reports the NVIDIA name "
                f"{name!r}: not claimed as Kunlun (an NVIDIA GPU is chip 'cuda', without {ADAPTER})")
        return name
