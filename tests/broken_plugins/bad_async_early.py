"""Broken plugin: all_reduce returns a work object whose wait() returns before the data is there.

The vendor's collective runs on a communication stream and copies the result back afterwards; the
work object it returns is "complete" as soon as the call is enqueued, so a caller that reads the
output right after wait() sees stale data (here the copy back lands 0.3 s later).
"""
import threading
import time

from ._base import DoneWork, GroupProxy, install

BUG = "all_reduce's work.wait() returns before the result is written"
CAUGHT_BY = "collectives.async_wait"
LEVELS = ["collectives"]
SELECT = ["collectives.async_wait", "collectives.broadcast.float32"]
STILL_PASSES = ["collectives.broadcast.float32"]
DELAY_S = 0.3


class Group(GroupProxy):
    def allreduce(self, tensors, opts=None, *args):
        tmp = [t.clone() for t in tensors]
        work = self.inner.allreduce(tmp, *(a for a in (opts, *args) if a is not None))

        def finish():
            work.wait()
            time.sleep(DELAY_S)
            for t, s in zip(tensors, tmp):
                t.copy_(s)

        threading.Thread(target=finish, daemon=True).start()
        return DoneWork()  # the bug: complete before the copy back


install(globals(), "bad_async_early", BUG, wrap_group=Group)
