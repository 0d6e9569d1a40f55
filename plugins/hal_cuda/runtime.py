"""The CUDA device runtime: torch.cuda itself, plus the device name the profile is picked by."""
from __future__ import annotations

from typing import Any, Optional

import torch

from hal import sdk


class CudaRuntime(sdk.TorchDeviceRuntime):
    """torch.cuda's streams, events, memory statistics, pinned memory and device selection.

    The order of a native bind is hal.core.selection.Accelerator's: the chip's probe (with
    ``bind=True``), then `hal_device_runtime` builds this object (no device touched), then
    ``device_count()``, then ``set_device_index(LOCAL_RANK % device_count())``, and only then
    ``device_name()`` (for the profile), the capability matrix and the kernels. All of it goes
    through torch.cuda, so CUDA_VISIBLE_DEVICES (applied by the CUDA runtime itself) decides which
    physical GPUs those indices mean.
    """

    def __init__(self, module: Any = None, device_type: str = "cuda",
                 visible_devices_env: str = "CUDA_VISIBLE_DEVICES"):
        super().__init__(module if module is not None else torch.cuda, device_type)
        self.visible_devices_env = visible_devices_env

    def device_name(self, index: Optional[int] = None) -> str:
        """The product name the driver reports, e.g. 'NVIDIA H100 80GB HBM3'."""
        return self.module.get_device_name(self.current_device_index() if index is None else index)

    def pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        # Page-locked host memory: host<->device copies become async DMA.
        return tensor if tensor.is_pinned() else tensor.pin_memory()
