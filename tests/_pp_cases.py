"""Functions the pipeline and composed-plan parity tests run on every rank of a WorkerPool.

Each case builds a Plan (strategies.plan) for a layout on a subset of the 6-rank pool's world
(cuda:3 = ranks 0-2, kunlun:2 = 3-4, ascend:1 = 5, all emulated), applies it with
strategies.apply.apply_plan, trains STEPS SGD steps on the same global batches a single-process run
sees, and returns the full parameters this rank's stage holds (names of the full model) and the loss
per step. The test process runs the single-process reference once and compares.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

MODEL_SEED, DATA_SEED = 0, 1
STEPS, LR = 3, 0.5


def init(backend: str = "hetero", timeout_s: float = 60.0) -> dict:
    import hal
    if backend == "hetero":
        import ccl_bridge  # noqa: F401 - registers the backend
    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    acc = hal.accelerator()
    return {"rank": dist.get_rank(), "chip": acc.chip.name, "emulated": acc.emulated,
            "backend": dist.get_backend()}


def build(cfg_kind: str):
    """(config, model) of the named test model, identical on every rank (private seed)."""
    from strategies.models import ModelConfig, build_model
    if cfg_kind == "tiny":  # dense GPT (RMSNorm, rotary attention, SwiGLU), 4 blocks, hidden 32
        cfg = ModelConfig(name="tiny", layers=4, hidden=32, heads=4, ffn=64, vocab=64, seq=16)
        return cfg, build_model(cfg, MODEL_SEED)
    raise ValueError(f"unknown test model {cfg_kind!r}")


def batches(cfg, global_batch: int) -> torch.Tensor:
    from strategies.models import make_batches
    return make_batches(cfg, STEPS, global_batch, DATA_SEED)  # (steps, global_batch, seq + 1)


def reference(cfg_kind: str, global_batch: int) -> dict:
    """Single process, whole global batch, mean loss, SGD: final params, initial params, losses."""
    from strategies.models import lm_loss
    cfg, model = build(cfg_kind)
    init_state = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    data = batches(cfg, global_batch)
    losses = []
    for step in range(STEPS):
        loss = lm_loss(model(data[step, :, :-1]), data[step, :, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"params": {n: p.detach().clone() for n, p in model.named_parameters()},
            "init": init_state, "losses": losses}


def train_plan(plan_json: str, cfg_kind: str = "tiny", runtime: str = "auto") -> dict[str, Any]:
    """apply_plan on this rank, STEPS SGD steps; returns held full params and global losses."""
    from strategies.apply import apply_plan
    from strategies.plan import Plan
    plan = Plan.from_json(plan_json)
    cfg, model = build(cfg_kind)
    run = apply_plan(model, plan, runtime=runtime, timeout=timedelta(seconds=60))
    opt = torch.optim.SGD(run.parameters(), lr=LR) if run.active else None
    data = batches(cfg, plan.global_batch)
    losses = []
    for step in range(STEPS):
        losses.append(run.step(data[step, :, :-1], data[step, :, 1:]).item())
        if opt is not None:
            opt.step()
            opt.zero_grad()
    held = run.full_parameters()
    roles = [(r.stage, r.replica, r.tp_index) for r in run.mesh.roles]
    return {"rank": dist.get_rank(), "roles": roles, "params": held, "losses": losses,
            "runtime": type(run.runtime).__name__ if run.runtime is not None else None}
