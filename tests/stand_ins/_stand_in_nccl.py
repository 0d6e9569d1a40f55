"""Stand-in for torch.distributed.ProcessGroupNCCL (absent from CPU builds of torch).

Follows the constructor torch 2.13 uses in torch/distributed/distributed_c10d.py
`_new_process_group_helper`: `ProcessGroupNCCL.Options()` (is_high_priority_stream, _timeout),
`ProcessGroupNCCL(store, group_rank, group_size, options)`, then `_set_sequence_number_for_group()`.
Instances append (rank, size, timeout, is_high_priority_stream, seq_set) to `CREATED`.
"""
from __future__ import annotations

from datetime import timedelta

CREATED: list[dict] = []


class FakeProcessGroupNCCL:
    class Options:
        def __init__(self) -> None:
            self.is_high_priority_stream = True
            self._timeout = timedelta(minutes=10)

    def __init__(self, store, rank: int, size: int, options: "FakeProcessGroupNCCL.Options"):
        if not isinstance(options, FakeProcessGroupNCCL.Options):
            raise TypeError(f"options must be ProcessGroupNCCL.Options, got {type(options).__name__}")
        self.record = {"store": store, "rank": rank, "size": size, "timeout": options._timeout,
                       "is_high_priority_stream": options.is_high_priority_stream, "seq_set": False}
        CREATED.append(self.record)

    def _set_sequence_number_for_group(self) -> None:
        self.record["seq_set"] = True

    def getBackendName(self) -> str:
        return "nccl"
