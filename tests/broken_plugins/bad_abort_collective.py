"""Broken plugin: all_gather aborts the process (a vendor library's assert on an unexpected layout).

The suite runs multi-rank checks in worker processes: the abort kills a worker, not the suite; the
check fails naming the signal and the next check runs on a fresh pool.
"""
import os

from ._base import GroupProxy, install

HANGS = True  # run by tests/test_conformance_bounds.py, with short bounds
BUG = "all_gather calls abort()"
CAUGHT_BY = "collectives.all_gather.float32"
LEVELS = ["collectives"]
SELECT = ["collectives.all_gather.float32", "collectives.broadcast.float32"]
STILL_PASSES = ["collectives.broadcast.float32"]
MESSAGE = ["SIGABRT"]


class Group(GroupProxy):
    def allgather(self, *args):
        os.abort()  # the bug


install(globals(), "bad_abort_collective", BUG, wrap_group=Group)
