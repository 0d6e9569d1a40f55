"""Broken plugin: Event.elapsed_time returns seconds, not milliseconds.

The number is finite and >= 0, so a check of the type passes; a profiler or planner reading it
thinks every kernel is a thousand times faster than it is.
"""
import hal
from hal.emulation.runtime import CpuEvent

from ._base import install

BUG = "elapsed_time in seconds instead of milliseconds"
CAUGHT_BY = "runtime.event_timing"
LEVELS = ["runtime"]
SELECT = ["runtime.event_timing", "runtime.synchronize"]
STILL_PASSES = ["runtime.synchronize"]
MESSAGE = ["millisecond"]


class Event(CpuEvent):
    def elapsed_time(self, end):
        return super().elapsed_time(end) / 1e3  # the bug


class Runtime(hal.CpuRuntime):
    Event = Event


install(globals(), "bad_timing_units", BUG, runtime=Runtime)
