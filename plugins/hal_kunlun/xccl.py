"""Kunlun's CCL (XCCL) behind torch's `nccl` backend: what is declared native, and group creation.

What XCCL does natively is not published as a table, and we could not run it, so the matrix
declares only what a public integration drives through this backend: baidu/vLLM-Kunlun@09869ee7
vllm_kunlun/distributed/kunlun_communicator.py routes all_reduce (vLLM's default SUM),
all_gather (into one tensor), gather and send/recv of model activations (float32, float16,
bfloat16) through the `nccl` device group. Everything else stays undeclared, which makes the HAL
bridge emulate it (correct, slower) until the conformance suite measures it on Kunlun hardware and
this matrix is widened. Undeclared never means "known broken": it means "not yet shown to work".

Group creation. KunlunXin's PyTorch build keeps the backend name `nccl` (vllm_kunlun/platforms/
kunlun.py @09869ee7: dist_backend = "nccl") and routes it to its CCL; its torch_xmlir replaces the
class torch constructs for that name and registers its own backend creator (the read of the
closed-source torch_xmlir recorded in issue 13; not in any source we could open -- medium
confidence). So the group is built the way torch's `distributed_c10d._new_process_group_helper`
(torch 2.13) would build it for `nccl` in that process, never from `torch.distributed.ProcessGroupNCCL`
(the name bound when torch.distributed was imported, which a swap does not change):
1. a creator registered for the name (`Backend._plugins["NCCL"]`): called as the helper calls
   registered creators -- extended API: a `_DistributedBackendOptions` with store, group_rank,
   group_size, timeout, group_id (= the HAL's group name), global_ranks_in_group; else
   `creator(store, rank, size, timeout)`;
2. otherwise the class the helper constructs, `distributed_c10d.ProcessGroupNCCL` (swapped or not),
   with Options filled as for NCCL (`hal_cuda.nccl.nccl_options`) and `_set_sequence_number_for_group`.

Timeouts (what a timeout does on XCCL). BKCL, KunlunXin's CCL (libbkcl, shipped as XCCL in the
PyTorch build), reads BKCL_TIMEOUT in seconds (PaddleX/PaddleOCR set "BKCL_TIMEOUT": "1800" for XPU;
a public P800 launch script sets it too); we set it to ceil(T) so the CCL never waits past the HAL
bound (a value the user set is replaced, with a warning). The process group is ProcessGroupNCCL's
clone, whose watchdog would tear the process down on a timeout like NCCL's: we set
TORCH_NCCL_ASYNC_ERROR_HANDLING=2 as for NCCL, and TORCH_XCCL_ASYNC_ERROR_HANDLING=2 for torch_xmlir's
newer process group, whose variables are named TORCH_XCCL_* (TORCH_XCCL_HEARTBEAT_TIMEOUT_SEC,
TORCH_XCCL_ENABLE_TIMING in a public P800 training launch script; the ASYNC_ERROR_HANDLING name is
inferred from that pattern, low confidence). Like NCCL's, the clone's first group would kill every
rank TORCH_*_HEARTBEAT_TIMEOUT_SEC after any rank's timeout while dump-on-timeout is on
(hal_cuda.nccl, point 2): we set TORCH_NCCL_DUMP_ON_TIMEOUT=0 and TORCH_XCCL_DUMP_ON_TIMEOUT=0 (the
second name inferred the same way, low confidence). The bridge waits with `work.wait(timeout)`.
"""
from __future__ import annotations

import math
import os
import warnings
from datetime import timedelta
from typing import Any, Optional, Sequence

from hal import sdk
from hal_cuda.nccl import ensure_catchable_timeouts, nccl_options

_DTYPES = ("float32", "float16", "bfloat16")
SOURCE = ("declared from usage in baidu/vLLM-Kunlun vllm_kunlun/distributed/kunlun_communicator.py "
          "(all_reduce sum, all_gather, gather, send/recv); not measured here; the rest is emulated")
ASYNC_ERROR_ENVS = ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_XCCL_ASYNC_ERROR_HANDLING")
DUMP_ON_TIMEOUT_ENVS = ("TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_XCCL_DUMP_ON_TIMEOUT")


def xccl_capabilities(chip: str = "kunlun") -> sdk.CapabilityMatrix:
    entries = {("all_reduce", d, "sum") for d in _DTYPES}
    for coll in ("all_gather", "all_gather_into_tensor", "gather", "send_recv"):
        entries |= {(coll, d, "-") for d in _DTYPES}
    return sdk.CapabilityMatrix(chip=chip, entries=frozenset(entries), source=SOURCE)


def apply_xccl_timeouts(timeout: timedelta, env: Optional[dict] = None) -> dict[str, str]:
    """BKCL_TIMEOUT (seconds) from the HAL timeout, and catchable-timeout handling (module docstring)."""
    env = os.environ if env is None else env
    want = {"BKCL_TIMEOUT": str(max(1, math.ceil(timeout.total_seconds())))}
    for name, value in want.items():
        old = env.get(name)
        if old is not None and old != value:
            warnings.warn(f"{name}={old} (set in the environment) replaced by {value}, derived from the HAL "
                          f"collective timeout {timeout.total_seconds():g} s", RuntimeWarning, stacklevel=3)
        env[name] = value
    if env is os.environ:
        ensure_catchable_timeouts(ASYNC_ERROR_ENVS, ccl="XCCL", dump_env_names=DUMP_ON_TIMEOUT_ENVS)
    return want


def create_xccl_process_group(store: Any, rank: int, world_size: int, timeout: timedelta,
                              global_ranks: Optional[Sequence[int]] = None, group_name: Optional[str] = None,
                              chip: str = "kunlun", backend: str = "nccl") -> Any:
    """The `backend` group as torch's `_new_process_group_helper` would build it in this process
    (a registered creator first, else distributed_c10d's class); see the module docstring."""
    ranks, name = sdk.check_process_group_args(chip, rank, world_size, timeout, global_ranks, group_name)
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    apply_xccl_timeouts(timeout)
    plugin = dist.Backend._plugins.get(backend.upper())
    if plugin is not None:
        if plugin.extended_api:
            opts = c10d._DistributedBackendOptions()
            opts.store, opts.group_rank, opts.group_size = store, rank, world_size
            opts.timeout, opts.group_id, opts.global_ranks_in_group = timeout, name, ranks
            return plugin.creator_fn(opts, None)
        return plugin.creator_fn(store, rank, world_size, timeout)
    pg_class = getattr(c10d, "ProcessGroupNCCL", None)
    if pg_class is None:
        raise sdk.ChipUnavailableError(
            f"chip {chip!r}, hook 'hal_create_process_group': torch has no creator registered for backend "
            f"{backend!r} and no distributed_c10d.ProcessGroupNCCL; KunlunXin's PyTorch build (torch_xmlir) "
            f"provides them (backed by XCCL)")
    pg = pg_class(store, rank, world_size, nccl_options(pg_class, timeout, ranks, name))
    seq = getattr(pg, "_set_sequence_number_for_group", None)
    if callable(seq):
        seq()
    return pg
