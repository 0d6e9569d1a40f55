"""Rank functions for tests/test_hetero_destroy.py (run in hal.testing.WorkerPool ranks)."""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist


def ddp_then_destroy(timeout_s: float = 60.0) -> dict:
    """What `hal demo` does at the end of its job: a default `hetero` group, DDP gradients through it,
    an all_reduce, a `hetero` subgroup destroyed on its own, then the default group destroyed."""
    import hal.ccl_bridge  # noqa: F401 - registers the `hetero` backend
    import hal

    acc = hal.accelerator()
    dist.init_process_group("hetero", timeout=timedelta(seconds=timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    model(torch.ones(2, 4)).sum().backward()
    x = torch.full((8,), float(rank + 1))
    dist.all_reduce(x)
    sub = dist.new_group([0, world - 1], backend="hetero", timeout=timedelta(seconds=timeout_s))
    if rank in (0, world - 1):
        y = torch.ones(4)
        dist.all_reduce(y, group=sub)
    dist.destroy_process_group(sub)
    dist.destroy_process_group()
    return {"chip": acc.chip.name, "emulated": acc.emulated, "sum": x[0].item(),
            "initialized_after": dist.is_initialized()}
