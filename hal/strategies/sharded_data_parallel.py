"""Sharded data parallelism: torch's FSDP2 (`fully_shard`) on a DeviceMesh built from any process group.

`DeviceMesh.from_group(group, device_type)` turns an existing group (the `hetero` world, say) into the
1-D mesh FSDP2 shards over; each transformer block becomes one FSDP unit so its all-gather and
reduce-scatter are separate collectives, then the root takes what is left (embedding, head).

A Plan's `zero` picks the sharding: 3 = fully_shard (parameters resharded after forward), 2 =
reshard_after_forward=False (parameters stay gathered from forward to backward; gradients and
optimizer state sharded). With uneven micro-batches, `sum_gradients=True` switches FSDP2's own
gradient averaging off (`disable_gradient_division`) so the loss can be normalised by the global
token count (see hal.strategies.data_parallel); gradient accumulation is hal.strategies.data_parallel.accumulate.
"""
from __future__ import annotations

from typing import Iterable, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from hal.contract.compat import fsdp as _fsdp

# torch.distributed.fsdp from torch 2.6, torch.distributed._composable.fsdp in 2.5 (hal.contract.compat)
FSDPModule, MixedPrecisionPolicy, fully_shard = _fsdp().FSDPModule, _fsdp().MixedPrecisionPolicy, _fsdp().fully_shard


def mesh_from_group(group: Optional[dist.ProcessGroup] = None, device_type: str = "cpu") -> DeviceMesh:
    """A 1-D DeviceMesh over `group` (default: the world)."""
    return DeviceMesh.from_group(group or dist.group.WORLD, device_type)


def shard_fsdp2(model: nn.Module, units: Iterable[nn.Module], mesh: DeviceMesh, zero: int = 3,
                sum_gradients: bool = False, mp_policy: Optional[MixedPrecisionPolicy] = None) -> nn.Module:
    """fully_shard every module of `units` (e.g. the blocks), then the root; returns the root.

    `zero` 3 reshards the units' parameters after forward, 2 keeps them gathered until backward; the
    root keeps fully_shard's default (FSDP2 does not reshard the root after forward on its own).
    `mp_policy`: FSDP2's MixedPrecisionPolicy (hal.strategies.precision.Precision.fsdp_policy); None =
    float32 throughout. Meta-device parameters are sharded as they are (materialise afterwards)."""
    if zero not in (2, 3):
        raise ValueError(f"shard_fsdp2: zero = {zero!r}; FSDP2 implements ZeRO levels 2 and 3 (0 is DDP)")
    mp = {} if mp_policy is None else {"mp_policy": mp_policy}
    for unit in units:
        fully_shard(unit, mesh=mesh, reshard_after_forward=zero == 3, **mp)
    fully_shard(model, mesh=mesh, **mp)
    if sum_gradients:
        disable_gradient_division(model)
    return model


def disable_gradient_division(model: nn.Module) -> None:
    """Make every FSDP2 unit of `model` SUM gradients (reduce-scatter) instead of averaging them.

    torch 2.13 (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, _get_gradient_divide_factors):
    a divide factor of 1.0 alone becomes ReduceOp.PREMUL_SUM(1.0), which gloo refuses; with
    force_sum_reduction_for_comms the reduction is a plain SUM followed by a division by the factor,
    which `_div_if_needed` skips for 1. `set_gradient_divide_factor` is per unit, hence the loop."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter gathered to a full tensor (a collective: call on every rank of the mesh)."""
    out = {}
    for name, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[name] = full.detach().clone()
    return out
