"""Broken plugin: broadcast always sends from rank 0, whatever root was asked for (the root
option is read from a field the vendor's binding never fills in)."""
import torch.distributed as dist

from ._base import GroupProxy, install

BUG = "broadcast ignores the root and sends from rank 0"
CAUGHT_BY = "collectives.broadcast.float32"
LEVELS = ["collectives"]
SELECT = ["collectives.broadcast.float32", "collectives.all_gather.float32"]
STILL_PASSES = ["collectives.all_gather.float32"]


class Group(GroupProxy):
    def broadcast(self, tensors, opts=None):
        fixed = dist.BroadcastOptions()
        fixed.rootRank = 0  # the bug
        return self.inner.broadcast(tensors, fixed)


install(globals(), "bad_broadcast_root", BUG, wrap_group=Group)
