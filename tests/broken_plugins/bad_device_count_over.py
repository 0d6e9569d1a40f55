"""Broken plugin: `device_count()` over-reports by one (it counts a device the node does not have).

The runtime says 2 devices on a node with 1; selecting the phantom one fails the way a real runtime
does (torch.cuda.set_device(1) on a one-GPU node: "invalid device ordinal"). Every rank binds
LOCAL_RANK % device_count(), so rank 1 (and 3) bind the phantom device and never join a group: without
the prerequisites every multi-rank check waited a group timeout for them (`--level all` ran for
most of its 48-minute bound). The suite must name the device count as the root cause and not run
what depends on it (tests/test_conformance_prereq.py).
"""
from typing import Optional

import hal

from ._base import install

BUG = "device_count() reports one device more than exists"
CAUGHT_BY = "runtime.device_count"
LEVELS = ["runtime"]
SELECT = ["runtime.device_count", "runtime.synchronize"]
STILL_PASSES = ["runtime.synchronize"]  # rank 0's own device is real
MESSAGE = ["device_count() = 2", "device 1", "over-reported"]

REAL_DEVICES = 1


class Runtime(hal.CpuRuntime):
    def __init__(self) -> None:
        super().__init__()
        self._current = 0

    def device_count(self) -> int:
        return REAL_DEVICES + 1  # the bug

    def current_device_index(self) -> int:
        return self._current

    def set_device_index(self, index: int) -> None:
        if not 0 <= index < REAL_DEVICES:
            raise RuntimeError(f"bad_device_count_over: device {index}: invalid device ordinal (the node has "
                               f"{REAL_DEVICES} device(s))")
        self._current = index

    def device(self, index: Optional[int] = None):
        if index is not None and not 0 <= index < REAL_DEVICES:
            raise RuntimeError(f"bad_device_count_over: device {index}: invalid device ordinal")
        return super().device(index)


install(globals(), "bad_device_count_over", BUG, runtime=Runtime)
