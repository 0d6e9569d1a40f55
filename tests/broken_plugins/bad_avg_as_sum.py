"""Broken plugin: ReduceOp.AVG is mapped to the CCL's SUM (the vendor's op table has no AVG entry
and falls back to SUM without dividing by the world size)."""
import torch.distributed as dist

from ._base import GroupProxy, install

BUG = "AVG computed as SUM (no division by the world size)"
CAUGHT_BY = "collectives.all_reduce.float32.avg"
LEVELS = ["collectives"]
SELECT = ["collectives.all_reduce.float32."]
STILL_PASSES = ["collectives.all_reduce.float32.sum", "collectives.all_reduce.float32.max"]


class Group(GroupProxy):
    def allreduce(self, tensors, opts=None, *args):
        if opts is not None and opts.reduceOp == dist.ReduceOp.AVG:
            fixed = dist.AllreduceOptions()
            fixed.reduceOp = dist.ReduceOp.SUM  # the bug
            opts = fixed
        return self.inner.allreduce(tensors, *(a for a in (opts, *args) if a is not None))


install(globals(), "bad_avg_as_sum", BUG, wrap_group=Group)
