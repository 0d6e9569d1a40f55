"""Broken plugin: event.synchronize() returns at once instead of waiting for the recorded work.

The chip's runtime models an asynchronous device: work recorded before an event finishes
`LATENCY_S` later (a queue on the device), and `query()` says so honestly. The bug is the classic
binding slip: `synchronize` is bound to the runtime's non-blocking *query* call, so it returns
before the work is done (and `Stream.wait_event`, which calls it, does not wait either).
"""
import time

import hal
from hal.emulation.runtime import CpuEvent, CpuStream

from ._base import install

BUG = "Event.synchronize() does not wait for the recorded work"
CAUGHT_BY = "runtime.event_wait"
LEVELS = ["runtime"]
SELECT = ["runtime.event_wait", "runtime.synchronize", "runtime.rng_determinism"]
STILL_PASSES = ["runtime.synchronize", "runtime.rng_determinism"]
LATENCY_S = 0.2


class LaggyEvent(CpuEvent):
    def record(self, stream=None):
        super().record(stream)
        self._done_at = time.monotonic() + LATENCY_S

    def query(self):
        return getattr(self, "_done_at", None) is not None and time.monotonic() >= self._done_at

    def synchronize(self):
        self.query()  # the bug: should block until query() is True


class LaggyStream(CpuStream):
    def wait_event(self, event):
        event.synchronize()

    def record_event(self, event=None):
        event = event or LaggyEvent()
        event.record(self)
        return event


class Runtime(hal.CpuRuntime):
    Stream = LaggyStream
    Event = LaggyEvent


install(globals(), "bad_event_wait", BUG, runtime=Runtime)
