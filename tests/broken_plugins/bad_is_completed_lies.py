"""Broken plugin: work.is_completed() is True as soon as a collective is posted.

The vendor's work object answers `is_completed()` from "enqueued on the communication engine", not
from "finished": code that polls it (to overlap communication with compute, as DDP's and FSDP's
bucketing may) reads the output before the result is there. `wait()` is right, so every golden
check passes; `collectives.semantics.*` query `is_completed()` right after the call while a peer is
delayed 0.2 s, and read the output when it says True.
"""
from ._base import GroupProxy, install

BUG = "work.is_completed() says True as soon as the collective is posted, before its result is written"
CAUGHT_BY = "collectives.semantics.all_reduce"
MESSAGE = ["is_completed() was True right after the call", "expected"]
LEVELS = ["collectives"]
SELECT = ["collectives.semantics.all_reduce", "collectives.all_reduce.float32.sum", "collectives.async_wait",
          "collectives.semantics.barrier"]
STILL_PASSES = ["collectives.all_reduce.float32.sum", "collectives.async_wait", "collectives.semantics.barrier"]


class _EnqueuedWork:
    def __init__(self, inner):
        self.inner = inner

    def wait(self, timeout=None):
        return self.inner.wait() if timeout is None else self.inner.wait(timeout)

    def is_completed(self):
        return True  # the bug: enqueued is not complete

    def is_success(self):
        return self.inner.is_success()


class Group(GroupProxy):
    def __getattr__(self, name):
        fn = getattr(self.inner, name)
        if name not in ("allreduce", "reduce", "broadcast", "allgather", "_allgather_base", "reduce_scatter",
                        "_reduce_scatter_base", "alltoall", "alltoall_base", "gather", "scatter", "send", "recv",
                        "barrier"):
            return fn
        return lambda *args, **kwargs: _EnqueuedWork(fn(*args, **kwargs))


install(globals(), "bad_is_completed_lies", BUG, wrap_group=Group)
