"""Broken plugin: barrier() returns at once, without waiting for the other ranks.

The vendor maps `barrier` to a device-side fence of its own stream (or a no-op when nothing is
queued), so the host leaves the barrier before its peers entered it. No tensor result shows it: a
barrier has none, and `collectives.barrier` only asks that three barriers complete. The ordering
check (`collectives.semantics.barrier`: the last rank enters 0.2 s late) does.
"""
from ._base import DoneWork, GroupProxy, install

BUG = "barrier() returns at once, before the other ranks entered it"
CAUGHT_BY = "collectives.semantics.barrier"
MESSAGE = ["barrier", "rank 0 left", "before rank 1 entered", "margin"]
LEVELS = ["collectives"]
SELECT = ["collectives.semantics.barrier", "collectives.barrier", "collectives.process_group",
          "collectives.semantics.all_reduce", "collectives.semantics.all_gather_into_tensor"]
STILL_PASSES = ["collectives.barrier", "collectives.process_group", "collectives.semantics.all_reduce",
                "collectives.semantics.all_gather_into_tensor"]


class Group(GroupProxy):
    def barrier(self, opts=None):
        return DoneWork()  # the bug: nothing waits for the peers


install(globals(), "bad_barrier_returns_early", BUG, wrap_group=Group)
