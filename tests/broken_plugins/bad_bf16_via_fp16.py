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


def _via_fp16(inner_call, tensors: list, opts, *rest):
    """Run a reducing collective on float16 copies of bfloat16 tensors and copy back (the bug)."""
    halves = [t.to(torch.float16) for t in tensors]
    work = inner_call(halves, opts, *rest)
    work.wait()
    for t, h in zip(tensors, halves):
        t.copy_(h.to(torch.bfloat16))
    return work


def _is_bf16_sum(t, opts) -> bool:
    return t.dtype == torch.bfloat16 and getattr(opts, "reduceOp", dist.ReduceOp.SUM) == dist.ReduceOp.SUM


class Group(GroupProxy):
    # The same kernel serves every reducing collective (the bridge reduces inside a chip with
    # reduce-scatter and reduce, so the bridge level meets the bug too).
    def allreduce(self, tensors, opts=None, *args):
        if not _is_bf16_sum(tensors[0], opts):
            return self.inner.allreduce(tensors, *(a for a in (opts, *args) if a is not None))
        return _via_fp16(lambda ts, o: self.inner.allreduce(ts, o), tensors, opts)

    def reduce(self, tensors, opts=None, *args):
        if not _is_bf16_sum(tensors[0], opts):
            return self.inner.reduce(tensors, *(a for a in (opts, *args) if a is not None))
        return _via_fp16(lambda ts, o: self.inner.reduce(ts, o), tensors, opts)

    def _reduce_scatter_base(self, output, input, opts=None):
        if not _is_bf16_sum(input, opts):
            return self.inner._reduce_scatter_base(output, input, *(a for a in (opts,) if a is not None))
        out16, in16 = output.to(torch.float16), input.to(torch.float16)
        work = self.inner._reduce_scatter_base(out16, in16, opts)
        work.wait()
        output.copy_(out16.to(torch.bfloat16))
        return work


install(globals(), "bad_bf16_via_fp16", BUG, wrap_group=Group)
