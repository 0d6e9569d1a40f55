"""Kunlun's CCL (XCCL) behind torch's `nccl` backend: what is declared native, and group creation.

What XCCL does natively is not published as a table, and we could not run it, so the matrix
declares only what a public integration drives through this backend: baidu/vLLM-Kunlun@09869ee7
vllm_kunlun/distributed/kunlun_communicator.py routes all_reduce (vLLM's default SUM),
all_gather (into one tensor), gather and send/recv of model activations (float32, float16,
bfloat16) through the `nccl` device group. Everything else stays undeclared, which makes the HAL
bridge emulate it (correct, slower) until the conformance suite measures it on Kunlun hardware and
this matrix is widened. Undeclared never means "known broken": it means "not yet shown to work".

Group creation is torch's: KunlunXin's PyTorch build keeps `ProcessGroupNCCL` (backend name
`nccl`) and routes it to its CCL (vllm_kunlun/platforms/kunlun.py: dist_backend = "nccl"), so the
group is built as distributed_c10d._new_process_group_helper builds an NCCL group: Options with
`_timeout`, then `ProcessGroupNCCL(store, rank, size, options)`.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import hal

_DTYPES = ("float32", "float16", "bfloat16")
SOURCE = ("declared from usage in baidu/vLLM-Kunlun vllm_kunlun/distributed/kunlun_communicator.py "
          "(all_reduce sum, all_gather, gather, send/recv); not measured here; the rest is emulated")


def xccl_capabilities(chip: str = "kunlun") -> hal.CapabilityMatrix:
    entries = {("all_reduce", d, "sum") for d in _DTYPES}
    for coll in ("all_gather", "all_gather_into_tensor", "gather", "send_recv"):
        entries |= {(coll, d, "-") for d in _DTYPES}
    return hal.CapabilityMatrix(chip=chip, entries=frozenset(entries), source=SOURCE)


def create_xccl_process_group(store: Any, rank: int, world_size: int, timeout: timedelta,
                              chip: str = "kunlun") -> Any:
    if not isinstance(timeout, timedelta) or timeout.total_seconds() <= 0:
        raise ValueError(f"chip {chip!r}, hook 'hal_create_process_group': timeout must be a positive "
                         f"datetime.timedelta, got {timeout!r}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"chip {chip!r}, hook 'hal_create_process_group': rank {rank} is not in "
                         f"[0, world_size={world_size})")
    import torch.distributed as dist
    pg_class = getattr(dist, "ProcessGroupNCCL", None)
    if pg_class is None:
        raise hal.ChipUnavailableError(
            f"chip {chip!r}, hook 'hal_create_process_group': torch.distributed.ProcessGroupNCCL is "
            f"missing; KunlunXin's PyTorch build provides it (backed by XCCL)")
    options = pg_class.Options()
    options.is_high_priority_stream = False
    options._timeout = timeout
    pg = pg_class(store, rank, world_size, options)
    seq = getattr(pg, "_set_sequence_number_for_group", None)
    if callable(seq):
        seq()
    return pg
