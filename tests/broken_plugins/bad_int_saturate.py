"""Broken plugin: int8 SUM saturates instead of wrapping.

The vendor's kernel accumulates int8 in a wider type and clamps on the way back (a saturating
store, right for quantized activations, wrong for torch's int8, which wraps). Values in a small
range never overflow, so only the dtype's whole range shows it.
"""
import torch
import torch.distributed as dist

from ._base import GroupProxy, install

BUG = "int8 SUM all_reduce saturates at -128/127 instead of wrapping"
CAUGHT_BY = "collectives.all_reduce.int8.sum"
LEVELS = ["collectives"]
SELECT = ["collectives.all_reduce.int8.sum", "collectives.all_reduce.int16.sum"]
STILL_PASSES = []  # int16 is undeclared for gloo; its check passes or refuses, not asserted
MESSAGE = ["int8"]


class Group(GroupProxy):
    def allreduce(self, tensors, opts=None, *args):
        t = tensors[0]
        if t.dtype != torch.int8 or getattr(opts, "reduceOp", dist.ReduceOp.SUM) != dist.ReduceOp.SUM:
            return self.inner.allreduce(tensors, *(a for a in (opts, *args) if a is not None))
        wide = t.to(torch.int32)
        work = self.inner.allreduce([wide], opts)
        work.wait()
        t.copy_(wide.clamp(-128, 127))  # the bug: saturates
        return work


install(globals(), "bad_int_saturate", BUG, wrap_group=Group)
