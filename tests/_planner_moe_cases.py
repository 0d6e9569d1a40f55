"""What tests/test_planner_moe_runtime.py runs on every rank of its WorkerPool: apply a MoE Plan with
hal.strategies.apply.apply_plan (no training) and count the parameter elements this rank holds locally,
split into expert parameters (`...experts.<id>...`) and the rest (DTensor parameters counted by their
local shard: what TP and FSDP2 leave on this rank)."""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist


def init(timeout_s: float = 60.0) -> dict:
    import hal.ccl_bridge  # noqa: F401 - registers the `hetero` backend
    import hal
    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("hetero", timeout=timedelta(seconds=timeout_s))
    acc = hal.accelerator()
    return {"rank": dist.get_rank(), "chip": acc.chip.name, "emulated": bool(acc.emulated)}


def held_elements(plan_json: str, model: dict) -> dict:
    from hal.strategies.apply import apply_plan
    from hal.strategies.models import ModelConfig, build_model
    from hal.strategies.plan import Plan
    cfg = ModelConfig(**model)
    run = apply_plan(build_model(cfg, 0), Plan.from_json(plan_json), timeout=timedelta(seconds=60))
    expert = dense = 0
    for mod in run.modules.values():
        for name, p in mod.named_parameters():
            n = getattr(p, "_local_tensor", p).numel()     # DTensor (TP / FSDP2): this rank's shard
            if ".experts." in name:
                expert += n
            else:
                dense += n
    return {"rank": dist.get_rank(), "expert": expert, "dense": dense,
            "wrappers": sorted(type(m).__name__ for m in run.modules.values())}
