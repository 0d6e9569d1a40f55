"""The collectives training issues, which a refusal may not stand in for.

A plugin's own CCL may leave most combinations to the HAL bridge (it declares what it does natively,
the bridge emulates the rest). But what training code issues must work end to end, so:

- `REQUIRED_BRIDGE`: every combination DDP, FSDP2, pipelining and expert parallel issue (below,
  with where torch issues it). On the bridge level (the plugin's chip in a `hetero` group) each must
  give the golden result; `hal.NotSupportedError` there is a failure, not a pass.
- `REQUIRED_NATIVE`: what every chip's own CCL must declare and get right (the collectives level):
  float32 and bfloat16 SUM all_reduce (DDP's gradient all-reduce; a CCL without it is not a training
  CCL, and the bridge would have to move every gradient through the host).

Sources (torch 2.13.0, the installed wheel):
- DDP, torch/nn/parallel/distributed.py and torch/csrc/distributed/c10d/reducer.cpp: gradient
  buckets all_reduce SUM in the parameters' dtype (float32, bfloat16, float16; the comm hooks of
  torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py divide first, then SUM);
  `_sync_module_states` broadcasts parameters and buffers (float dtypes and int64, e.g. BatchNorm's
  num_batches_tracked); `_verify_param_shape_across_processes` all_gathers int64 shape metadata.
- FSDP2, torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py: `foreach_all_gather` issues
  all_gather_into_tensor in the parameters' dtype, or uint8 when they are mixed
  (`_get_all_gather_input_metadatas`); `foreach_reduce` issues reduce_scatter_tensor with the op of
  `_get_gradient_divide_factors`: AVG for float32/bfloat16 (SUM when force_sum_reduction_for_comms,
  PREMUL_SUM(1/factor) with a custom factor), SUM after a pre-division for other dtypes (float16);
  HSDP adds all_reduce with the same ops.
- Pipelining, torch/distributed/pipelining/stage.py and schedules.py: activations and gradients go
  by batch_isend_irecv (send/recv in the activation dtype); shape inference sends metadata objects
  (send/recv of uint8 payloads and int64 sizes, torch/distributed/distributed_c10d.py send_object_list).
- Expert parallel, pytorch/torchtitan torchtitan/distributed/expert_parallel.py: tokens are
  dispatched and combined by all_to_all_single with uneven splits (bfloat16/float32 activations),
  after an all_to_all_single of the int64 per-expert token counts.
- Everywhere: barrier; the training loop all-reduces int64 token counts (SUM, the global-token loss
  normalisation) and float32 MAX (gradient-norm clipping with the inf norm, AMP's found-inf flag).
"""
from __future__ import annotations

from typing import Optional

_FLOAT = ("float32", "bfloat16", "float16")

# (collective, dtype, op or None) -> who issues it
REQUIRED_BRIDGE: dict[tuple[str, str, Optional[str]], str] = {}


def _add(who: str, collective: str, dtypes, ops=(None,)) -> None:
    for d in dtypes:
        for op in ops:
            key = (collective, d, op)
            REQUIRED_BRIDGE[key] = f"{REQUIRED_BRIDGE[key]}, {who}" if key in REQUIRED_BRIDGE else who


_add("DDP gradient all-reduce", "all_reduce", _FLOAT, ("sum",))
_add("DDP module-state broadcast", "broadcast", _FLOAT + ("int64",))
_add("DDP parameter-shape check", "all_gather", ("int64",))
_add("FSDP2 all-gather", "all_gather_into_tensor", ("float32", "bfloat16", "uint8"))
_add("FSDP2 reduce-scatter", "reduce_scatter_tensor", ("float32", "bfloat16"), ("avg", "sum", "premul_sum"))
_add("FSDP2 reduce-scatter (pre-divided)", "reduce_scatter_tensor", ("float16",), ("sum",))
_add("HSDP all-reduce", "all_reduce", ("float32", "bfloat16"), ("avg",))
_add("pipelining send/recv", "send_recv", _FLOAT + ("uint8", "int64"))
_add("expert-parallel dispatch/combine", "all_to_all_single", ("float32", "bfloat16", "int64"))
_add("token-count all-reduce", "all_reduce", ("int64",), ("sum",))
_add("grad-norm clipping / AMP found-inf", "all_reduce", ("float32",), ("max",))

REQUIRED_NATIVE: dict[tuple[str, str, Optional[str]], str] = {
    ("all_reduce", "float32", "sum"): "DDP gradient all-reduce",
    ("all_reduce", "bfloat16", "sum"): "DDP gradient all-reduce",
}


def required_by(table: dict, collective: str, dtype: str, op: Optional[str]) -> Optional[str]:
    """Who issues (collective, dtype, op), or None if training does not require it."""
    return table.get((collective, dtype, op))
