"""The Ascend device runtime: torch_npu's `torch.npu` module, which mirrors torch.cuda's functions.

torch_npu/npu/__init__.py (Ascend/pytorch@9e73e708) provides set_device, current_device,
device_count, synchronize, current_stream, Stream, Event, mem_get_info, memory_allocated,
max_memory_allocated, memory_reserved, reset_peak_memory_stats, memory_stats, manual_seed and
get_device_name ('Ascend910B2', ...). ASCEND_RT_VISIBLE_DEVICES is applied by torch_npu itself
(`_parse_visible_devices`): indices here are positions in that list.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from hal import sdk


class NpuRuntime(sdk.TorchDeviceRuntime):
    def __init__(self, module: Any = None, device_type: str = "npu"):
        super().__init__(module if module is not None else torch.npu, device_type)

    def device_name(self, index: Optional[int] = None) -> str:
        return self.module.get_device_name(self.current_device_index() if index is None else index)

    def pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        # torch_npu backs Tensor.pin_memory with its host caching allocator.
        return tensor if tensor.is_pinned() else tensor.pin_memory()
