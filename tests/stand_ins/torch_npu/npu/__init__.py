"""Stand-in for torch_npu.npu (torch.npu): names and side effects of torch_npu/npu/__init__.py,
utils.py and _backends.py @ 9e73e708.

Side effects modelled because the HAL must respect them:
- `current_device()`, `get_device_name()`, `get_soc_version()`, `mem_get_info()` without a device and
  Stream/Event creation run `_lazy_init()`: the NPU runtime starts and a context is opened on the
  calling thread's current device, which is device 0 until `set_device` (utils.py `current_device`:
  `torch_npu.npu._lazy_init(); return torch_npu._C._npu_getDevice()`). `STATE.contexts` records every
  device a context was opened on, so a rank that asks before selecting shows up as a context on 0.
- `device_count()` and `is_initialized()` start nothing.
- The current device is per thread, as with aclrtSetDevice.
- `get_device_name(device)` returns the *current* device's name (it ignores the index after
  checking it, as `_npu_getDeviceName()` does).
"""
from __future__ import annotations

from typing import Any, Optional

from .._state import STATE
from ._streams import Event, Stream, current_stream  # noqa: F401


def _index(device: Any) -> int:
    if device is None:
        return STATE.current
    if isinstance(device, int):
        return device
    return int(str(device).split(":")[-1]) if ":" in str(device) else getattr(device, "index", None) or 0


def _lazy_init(why: str = "_lazy_init") -> None:
    STATE.open_context(STATE.current, why)


def is_available() -> bool:
    return STATE.device_count > 0


def is_initialized() -> bool:
    return STATE.initialized


def device_count() -> int:
    return STATE.device_count


def current_device() -> int:
    _lazy_init("current_device")
    return STATE.current


def set_device(device: Any) -> None:
    STATE.record.record("set_device", device)
    index = _index(device)
    if not 0 <= index < STATE.device_count:
        raise RuntimeError(f"Invalid device id {index} (stand-in has {STATE.device_count})")
    STATE.current = index
    STATE.open_context(index, "set_device")


def synchronize(device: Any = None) -> None:
    _lazy_init("synchronize")
    STATE.record.record("synchronize", device)


def get_device_name(device_name: Optional[Any] = None) -> str:
    STATE.record.record("get_device_name", device_name)
    index = _index(device_name)
    if not 0 <= index < STATE.device_count:
        raise AssertionError("Invalid device id")
    _lazy_init("get_device_name")
    return STATE.device_name


def get_soc_version() -> int:
    STATE.record.record("get_soc_version")
    _lazy_init("get_soc_version")
    return STATE.soc_version


def mem_get_info(device: Any = None) -> tuple[int, int]:
    STATE.record.record("mem_get_info", device)
    if device is None:
        current_device()
    return STATE.free_bytes, STATE.total_bytes


def memory_allocated(device: Any = None) -> int:
    return STATE.total_bytes - STATE.free_bytes


def max_memory_allocated(device: Any = None) -> int:
    return memory_allocated(device)


def memory_reserved(device: Any = None) -> int:
    return memory_allocated(device)


def reset_peak_memory_stats(device: Any = None) -> None:
    STATE.record.record("reset_peak_memory_stats", device)


def memory_stats(device: Any = None) -> dict:
    return {"allocated_bytes.all.current": memory_allocated(device)}


def manual_seed(seed: int) -> None:
    STATE.record.record("manual_seed", seed)
