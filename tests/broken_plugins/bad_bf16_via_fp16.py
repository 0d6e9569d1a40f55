"""Broken plugin: bfloat16 SUM is computed through float16 (the only 16-bit float the kernel has).

Both are 16-bit floats and the mantissa of float16 is wider, so sums of values of order 1 are right
(within bfloat16's rounding). But float16 tops out at 65504: bfloat16 values beyond it become inf,
and tiny ones flush. Only inputs over the dtype's whole range show it.
"""
import torch
import torch.distributed as dist

from ._base import GroupProxy, install

BUG = "bfloat16 SUM all_reduce goes through float16 (overflows above 65504)"
CAUGHT_BY = "collectives.all_reduce.bfloat16.sum"
LEVELS = ["collectives"]
SELECT = ["collectives.all_reduce.bfloat16.sum", "collectives.all_reduce.float16.sum"]
STILL_PASSES = ["collectives.all_reduce.float16.sum"]
MESSAGE = ["outside the rounding bound"]


class Group(GroupProxy):
    def allreduce(self, tensors, opts=None, *args):
        t = tensors[0]
        if t.dtype != torch.bfloat16 or getattr(opts, "reduceOp", dist.ReduceOp.SUM) != dist.ReduceOp.SUM:
            return self.inner.allreduce(tensors, *(a for a in (opts, *args) if a is not None))
        half = t.to(torch.float16)
        work = self.inner.allreduce([half], opts)
        work.wait()
        t.copy_(half.to(torch.bfloat16))
        return work


install(globals(), "bad_bf16_via_fp16", BUG, wrap_group=Group)
