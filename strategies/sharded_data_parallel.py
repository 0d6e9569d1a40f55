"""Sharded data parallelism: torch's FSDP2 (`fully_shard`) on a DeviceMesh built from any process group.

`DeviceMesh.from_group(group, device_type)` turns an existing group (the `hetero` world, say) into the
1-D mesh FSDP2 shards over; each transformer block becomes one FSDP unit so its all-gather and
reduce-scatter are separate collectives, then the root takes what is left (embedding, head).
"""
from __future__ import annotations

from typing import Iterable, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard


def mesh_from_group(group: Optional[dist.ProcessGroup] = None, device_type: str = "cpu") -> DeviceMesh:
    """A 1-D DeviceMesh over `group` (default: the world)."""
    return DeviceMesh.from_group(group or dist.group.WORLD, device_type)


def shard_fsdp2(model: nn.Module, units: Iterable[nn.Module], mesh: DeviceMesh) -> nn.Module:
    """fully_shard every module of `units` (e.g. the blocks), then the root; returns the root."""
    for unit in units:
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter gathered to a full tensor (a collective: call on every rank of the mesh)."""
    out = {}
    for name, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[name] = full.detach().clone()
    return out
