"""Broken plugin: SUM all_reduce by recursive doubling without the non-power-of-two step.

Rank r exchanges with r ^ 2^k for each k and adds; a partner outside the world is skipped. Right
for 2 and 4 ranks, wrong for 3 (rank 1 never hears from rank 2): only an odd world size shows it.
"""
import torch
import torch.distributed as dist

from ._base import DoneWork, GroupProxy, install

BUG = "all_reduce SUM assumes a power-of-two world size (recursive doubling, no fix-up step)"
CAUGHT_BY = "collectives.all_reduce.float32.sum"
LEVELS = ["collectives"]
SELECT = ["collectives.all_reduce.float32.sum", "collectives.all_reduce.float32.max"]
STILL_PASSES = ["collectives.all_reduce.float32.max"]
NPROC = 4
MESSAGE = ["world size 3"]


class Group(GroupProxy):
    def allreduce(self, tensors, opts=None, *args):
        op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
        if op != dist.ReduceOp.SUM or not tensors[0].numel():
            return self.inner.allreduce(tensors, *(a for a in (opts, *args) if a is not None))
        t, rank, world = tensors[0], self.inner.rank(), self.inner.size()
        acc = t.detach().clone().contiguous()
        k = 1
        while k < world:
            partner = rank ^ k
            if partner < world:  # the bug: a missing partner is skipped, its share never arrives
                got = torch.empty_like(acc)
                works = [self.inner.send([acc.clone()], partner, 91), self.inner.recv([got], partner, 91)]
                for w in works:
                    w.wait()
                acc = acc + got
            k *= 2
        t.copy_(acc)
        return DoneWork()


install(globals(), "bad_power_of_two", BUG, wrap_group=Group)
