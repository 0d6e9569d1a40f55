"""Broken plugin: all_reduce hands the CCL the storage's base address, not the tensor's.

`t.untyped_storage().data_ptr()` instead of `t.data_ptr()`: right for a tensor that starts its
storage (most), wrong for a view with a storage offset (a slice of a flat gradient bucket): the sum
lands at the start of the storage, over the caller's neighbouring data, and the view is unchanged.
"""
import torch

from ._base import GroupProxy, install

BUG = "all_reduce ignores the tensor's storage offset"
CAUGHT_BY = "collectives.all_reduce.float32.sum"
LEVELS = ["collectives"]
SELECT = ["collectives.all_reduce.float32.sum", "collectives.broadcast.float32"]
STILL_PASSES = ["collectives.broadcast.float32"]
MESSAGE = ["storage offset"]


class Group(GroupProxy):
    def allreduce(self, tensors, opts=None, *args):
        wrong = [torch.as_strided(t, t.shape, t.stride(), 0) if t.storage_offset() else t for t in tensors]
        return self.inner.allreduce(wrong, *(a for a in (opts, *args) if a is not None))


install(globals(), "bad_storage_offset", BUG, wrap_group=Group)
