"""Broken plugin: all_reduce's wait() gives up after 50 ms and returns as if the call were complete.

The vendor's wait polls its progress engine with a deadline and treats the deadline as success
(the collective goes on in the background and writes the result into the caller's tensor when the
last peer arrives). When the ranks enter together, as in the golden checks, the call finishes well
within the deadline and every result is right; a rank whose peer is late leaves before that peer
entered. `collectives.semantics.all_reduce` delays the last rank 0.2 s.
"""
import threading

from ._base import GroupProxy, install

BUG = "all_reduce's wait() returns after a 50 ms deadline even if a peer has not entered yet"
CAUGHT_BY = "collectives.semantics.all_reduce"
MESSAGE = ["all_reduce", "rank 0 left", "before rank 1 entered", "margin"]
LEVELS = ["collectives"]
SELECT = ["collectives.semantics.all_reduce", "collectives.semantics.barrier", "collectives.semantics.broadcast"]
# (the golden collectives.all_reduce.float32.sum passes too when the host is idle, but on a loaded one a
# rank can fall 50 ms behind its peer, so it is not asserted here)
STILL_PASSES = ["collectives.semantics.barrier", "collectives.semantics.broadcast"]
DEADLINE_S = 0.05


class _DeadlineWork:
    def __init__(self, inner):
        self.inner = inner
        self._done = threading.Thread(target=inner.wait, daemon=True)
        self._done.start()

    def wait(self, timeout=None):
        self._done.join(DEADLINE_S)  # the bug: the deadline passes for completion
        return True

    def is_completed(self):
        return self.inner.is_completed()

    def is_success(self):
        return self.inner.is_success()


class Group(GroupProxy):
    def allreduce(self, tensors, *args):
        return _DeadlineWork(self.inner.allreduce(tensors, *args))


install(globals(), "bad_allreduce_no_sync", BUG, wrap_group=Group)
