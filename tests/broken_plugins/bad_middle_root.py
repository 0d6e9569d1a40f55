"""Broken plugin: a chain broadcast that stops at the last rank instead of wrapping around.

The data travels root -> root + 1 -> ...; the vendor special-cased root == world - 1 (wrap to 0) and
tested roots 0 and the last only. For a root in the middle, ranks below it keep their own data.
"""

from ._base import DoneWork, GroupProxy, install

BUG = "broadcast from a root other than 0 or the last leaves the ranks below the root unchanged"
CAUGHT_BY = "collectives.broadcast.float32"
LEVELS = ["collectives"]
SELECT = ["collectives.broadcast.float32", "collectives.all_reduce.float32.sum"]
STILL_PASSES = ["collectives.all_reduce.float32.sum"]
NPROC = 4
MESSAGE = ["root=1"]


class Group(GroupProxy):
    def broadcast(self, tensors, opts=None, *args):
        root = getattr(opts, "rootRank", 0)
        t, rank, world = tensors[0], self.inner.rank(), self.inner.size()
        last = world - 1 if root != world - 1 else root - 1 + world  # the bug: no wrap unless root is last
        order = [r % world for r in range(root, last + 1)]
        if rank not in order or not t.numel():
            return DoneWork()
        buf = t.detach().clone().contiguous()
        i = order.index(rank)
        if i > 0:
            self.inner.recv([buf], order[i - 1], 92).wait()
            t.copy_(buf)
        if i + 1 < len(order):
            self.inner.send([buf], order[i + 1], 92).wait()
        return DoneWork()


install(globals(), "bad_middle_root", BUG, wrap_group=Group)
