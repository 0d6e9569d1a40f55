"""Broken plugin: memory statistics are read once at start-up and cached, so memory_allocated()
never moves (a planner that budgets memory from them would overcommit the device)."""
import hal

from ._base import install

BUG = "memory_allocated() is frozen at its start-up value"
CAUGHT_BY = "runtime.memory_stats"
LEVELS = ["runtime"]
SELECT = ["runtime.memory_stats", "runtime.memory_info"]
STILL_PASSES = ["runtime.memory_info"]


class Runtime(hal.CpuRuntime):
    def __init__(self):
        super().__init__()
        self._frozen = super().memory_allocated()  # the bug: read once

    def memory_allocated(self):
        return self._frozen


install(globals(), "bad_memory_frozen", BUG, runtime=Runtime)
