"""Broken plugin: all_reduce of bfloat16 runs the float16 kernel on the same bits.

A dtype-enum mix-up in the plugin's dispatch table (bf16 and fp16 are both 2-byte floats, and the
table is indexed by element size): the bytes are reduced as float16, so every other dtype is right
and bfloat16 sums are garbage.
"""
import torch

from ._base import GroupProxy, install

BUG = "all_reduce reduces bfloat16 bits as float16"
CAUGHT_BY = "collectives.all_reduce.bfloat16.sum"
LEVELS = ["collectives"]
SELECT = ["collectives.all_reduce.bfloat16.", "collectives.all_reduce.float16.", "collectives.all_reduce.float32."]
STILL_PASSES = ["collectives.all_reduce.float32.sum", "collectives.all_reduce.float16.sum"]


class Group(GroupProxy):
    def allreduce(self, tensors, opts=None, *args):
        if tensors and tensors[0].dtype == torch.bfloat16:
            views = [t.view(torch.float16) for t in tensors]  # the bug: same bytes, wrong type
            return self.inner.allreduce(views, *(a for a in (opts, *args) if a is not None))
        return self.inner.allreduce(tensors, *(a for a in (opts, *args) if a is not None))


install(globals(), "bad_reduce_dtype", BUG, wrap_group=Group)
