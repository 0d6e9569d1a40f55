"""Stand-in for torch_npu._C._distributed_c10d.ProcessGroupHCCL and its Options.

Constructed as torch_npu/_init/registry/distributed.py `_new_process_group_hccl_helper` does
(Ascend/pytorch @ 9e73e708): `ProcessGroupHCCL(store, group_rank, group_size, options)`. The record
includes the HCCL_* timeout variables as they were when the group was built, because HCCL reads
them at communicator creation.
"""
from __future__ import annotations

import os
from datetime import timedelta

from .._state import STATE


class ProcessGroupHCCL:
    class Options:
        def __init__(self) -> None:
            self.is_high_priority_stream = True
            self._timeout = timedelta(minutes=30)
            self.global_ranks_in_group: list[int] = []
            self.group_id = ""

    def __init__(self, store, rank: int, size: int, options: "ProcessGroupHCCL.Options"):
        if not isinstance(options, ProcessGroupHCCL.Options):
            raise TypeError(f"options must be ProcessGroupHCCL.Options, got {type(options).__name__}")
        env = {k: os.environ.get(k) for k in ("HCCL_EXEC_TIMEOUT", "HCCL_CONNECT_TIMEOUT")}
        STATE.record.record("ProcessGroupHCCL", rank, size, timeout_s=options._timeout.total_seconds(),
                            is_high_priority_stream=options.is_high_priority_stream,
                            group_id=options.group_id, env=env, store=type(store).__name__)
        self._rank, self._size, self.options = rank, size, options

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def getBackendName(self) -> str:
        return "hccl"
