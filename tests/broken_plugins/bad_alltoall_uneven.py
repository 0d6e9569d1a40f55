"""Broken plugin: all_to_all_single with uneven splits places every chunk after the first one
element late (an inclusive/exclusive prefix-sum mix-up on the receive side).

Even splits take the vendor's fast path and are right; only uneven splits (MoE token routing)
go through the offset computation with the off-by-one.
"""
import torch
import torch.distributed as dist

from ._base import DoneWork, GroupProxy, install

BUG = "all_to_all_single: receive offsets off by one for uneven splits"
CAUGHT_BY = "collectives.all_to_all_single.float32"
LEVELS = ["collectives"]
SELECT = ["collectives.all_to_all_single.float32", "collectives.all_reduce.float32.sum"]
STILL_PASSES = ["collectives.all_reduce.float32.sum"]


class Group(GroupProxy):
    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = opts or dist.AllToAllOptions()
        if not output_split_sizes or len(set(output_split_sizes)) <= 1:
            return self.inner.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)
        tmp = torch.empty_like(output)
        self.inner.alltoall_base(tmp, input, output_split_sizes, input_split_sizes, opts).wait()
        src = 0
        for j, n in enumerate(output_split_sizes):
            dst = src + (1 if j > 0 else 0)  # the bug: inclusive offset for every chunk but the first
            m = max(0, min(n, output.numel() - dst))
            output[dst:dst + m].copy_(tmp[src:src + m])
            src += n
        return DoneWork()


install(globals(), "bad_alltoall_uneven", BUG, wrap_group=Group)
