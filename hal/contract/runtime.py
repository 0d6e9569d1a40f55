"""The per-chip device runtime: the small surface a plugin implements (devices, streams, memory, RNG).

Names follow `torch.accelerator` / `torch.cuda`. Which class a plugin returns from `hal_device_runtime`:
- `TorchDeviceRuntime(module, device_type)`: the adapter's torch.<type> module mirrors torch.cuda's
  functions (torch.cuda itself, torch_npu's torch.npu, torch.xpu). A module that lacks some of them
  (torch.cpu, torch.mps) is refused with `NotSupportedError` naming each missing function, unless a
  subclass defines those methods itself.
- `hal.emulation.runtime.CpuRuntime()`: the chip computes on host (CPU) tensors; it serves the `cpu` chip, a vendor chip
  whose device type is `cpu`, and (as `EmulatedRuntime`) every emulated chip (timed: hal.emulation.timed).
- a `DeviceRuntime` subclass: anything else (every method below).
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from hal.contract.errors import NotSupportedError


class DeviceRuntime:
    """What the HAL needs from a chip's runtime. Every method is bound once by the accelerator."""

    device_type: str = "cpu"

    def device_count(self) -> int:
        raise NotImplementedError

    def current_device_index(self) -> int:
        raise NotImplementedError

    def set_device_index(self, index: int) -> None:
        raise NotImplementedError

    def device(self, index: Optional[int] = None) -> torch.device:
        return torch.device(self.device_type, self.current_device_index() if index is None else index)

    def synchronize(self, index: Optional[int] = None) -> None:
        raise NotImplementedError

    # Streams and events: classes with torch.cuda.Stream / torch.cuda.Event's interface.
    Stream: Any = None
    Event: Any = None

    def current_stream(self) -> Any:
        raise NotImplementedError

    def memory_allocated(self) -> int:
        raise NotImplementedError

    def max_memory_allocated(self) -> int:
        raise NotImplementedError

    def memory_reserved(self) -> int:
        raise NotImplementedError

    def reset_peak_memory_stats(self) -> None:
        raise NotImplementedError

    def memory_stats(self) -> dict[str, Any]:
        raise NotImplementedError

    def get_memory_info(self) -> tuple[int, int]:
        """(free, total) bytes of device memory."""
        raise NotImplementedError

    def manual_seed(self, seed: int) -> None:
        raise NotImplementedError

    def pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        """Page-locked host copy of `tensor` for fast, async host<->device copies."""
        return tensor.pin_memory()

    def supported_dtypes(self) -> tuple[torch.dtype, ...]:
        return (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8,
                torch.int16, torch.int32, torch.int64, torch.bool)


# DeviceRuntime attribute -> the torch.cuda-style module function it is bound to.
MODULE_FUNCTIONS = {
    "Stream": "Stream", "Event": "Event", "device_count": "device_count",
    "current_device_index": "current_device", "set_device_index": "set_device",
    "synchronize": "synchronize", "current_stream": "current_stream",
    "memory_allocated": "memory_allocated", "max_memory_allocated": "max_memory_allocated",
    "memory_reserved": "memory_reserved", "reset_peak_memory_stats": "reset_peak_memory_stats",
    "memory_stats": "memory_stats", "get_memory_info": "mem_get_info", "manual_seed": "manual_seed",
}


class TorchDeviceRuntime(DeviceRuntime):
    """Runtime over a torch device module with torch.cuda's function names (torch.cuda, torch.npu).

    Each attribute of `MODULE_FUNCTIONS` is bound once to the module's function. A subclass may
    define some of those methods itself (e.g. memory statistics its module lacks); a function that
    is neither in the module nor defined by a subclass refuses construction with `NotSupportedError`
    naming the module and every missing function (not an AttributeError at the first call)."""

    def __init__(self, module: Any, device_type: str, dtypes: Optional[tuple[torch.dtype, ...]] = None):
        self.module = module
        self.device_type = device_type
        self._dtypes = dtypes
        missing = []
        for attr, fn in MODULE_FUNCTIONS.items():
            if hasattr(module, fn):
                # Bind once: these are called on hot paths (synchronize, current_stream).
                setattr(self, attr, getattr(module, fn))
            elif getattr(type(self), attr) is getattr(DeviceRuntime, attr):  # no subclass definition
                missing.append(fn)
        if missing:
            name = getattr(module, "__name__", repr(module))
            hint = ("hal.CpuRuntime() is the runtime for a chip that computes on host tensors"
                    if device_type == "cpu" else
                    "subclass hal.TorchDeviceRuntime and define the missing methods, or subclass hal.DeviceRuntime")
            raise NotSupportedError(f"TorchDeviceRuntime({name}, {device_type!r}): the module lacks "
                                    f"{', '.join(missing)} (torch.cuda's names); {hint}")

    def supported_dtypes(self) -> tuple[torch.dtype, ...]:
        return self._dtypes or super().supported_dtypes()
