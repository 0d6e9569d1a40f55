"""Stand-in for torch_npu.npu (torch.npu): torch_npu/npu/__init__.py and utils.py @ 9e73e708 names."""
from __future__ import annotations

from typing import Any, Optional

from .._state import STATE


class Stream:
    def __init__(self, device: Any = None, priority: int = 0):
        STATE.record.record("Stream", device=device, priority=priority)

    def synchronize(self) -> None:
        STATE.record.record("Stream.synchronize")


class Event:
    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        STATE.record.record("Event", enable_timing=enable_timing)


def is_available() -> bool:
    return STATE.device_count > 0


def device_count() -> int:
    return STATE.device_count


def current_device() -> int:
    return STATE.current


def set_device(device: Any) -> None:
    STATE.record.record("set_device", device)
    index = device if isinstance(device, int) else int(str(device).split(":")[-1])
    if not 0 <= index < STATE.device_count:
        raise RuntimeError(f"Invalid device id {index} (stand-in has {STATE.device_count})")
    STATE.current = index


def synchronize(device: Any = None) -> None:
    STATE.record.record("synchronize", device)


def current_stream(device: Any = None) -> Stream:
    return Stream(device)


def get_device_name(device_name: Optional[Any] = None) -> str:
    STATE.record.record("get_device_name", device_name)
    return STATE.device_name


def mem_get_info(device: Any = None) -> tuple[int, int]:
    STATE.record.record("mem_get_info", device)
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
