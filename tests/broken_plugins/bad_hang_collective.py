"""Broken plugin: float64 all_reduce blocks forever (a CCL kernel waiting on a flag no peer sets).

The group ignores its timeout for that one dtype, so the call neither returns nor raises: the suite
must cut it at the check's timeout, say where each rank was stuck, restart the pool and go on.
"""
import threading

import torch

from ._base import GroupProxy, install

HANGS = True  # run by tests/test_conformance_bounds.py, with short bounds
BUG = "all_reduce of float64 never returns (ignores the group's timeout)"
CAUGHT_BY = "collectives.all_reduce.float64.sum"
LEVELS = ["collectives"]
SELECT = ["collectives.all_reduce.float64.sum", "collectives.all_reduce.float32.sum"]
STILL_PASSES = ["collectives.all_reduce.float32.sum"]  # runs after the hang, on a fresh pool
MESSAGE = ["did not finish within", "bad_hang_collective.py"]


class Group(GroupProxy):
    def allreduce(self, tensors, opts=None, *args):
        if tensors and tensors[0].dtype == torch.float64:
            threading.Event().wait()  # the bug: waits forever
        return self.inner.allreduce(tensors, *(a for a in (opts, *args) if a is not None))


install(globals(), "bad_hang_collective", BUG, wrap_group=Group)
