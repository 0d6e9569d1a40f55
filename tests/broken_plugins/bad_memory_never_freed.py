"""Broken plugin: memory_allocated() counts allocations but never frees.

A counter hooked on the allocator's malloc path only: it rises with reality, so a check that only
looks for growth passes, but it never falls, and a planner reading it thinks the device is full.
"""
import hal

from ._base import install

BUG = "memory_allocated() never falls when memory is freed"
CAUGHT_BY = "runtime.memory_stats"
LEVELS = ["runtime"]
SELECT = ["runtime.memory_stats", "runtime.memory_info"]
STILL_PASSES = ["runtime.memory_info"]
MESSAGE = ["fall"]


class Runtime(hal.CpuRuntime):
    def __init__(self):
        super().__init__()
        self._high = 0

    def memory_allocated(self):
        self._high = max(self._high, super().memory_allocated())  # the bug: a high-water mark
        return self._high


install(globals(), "bad_memory_never_freed", BUG, runtime=Runtime)
