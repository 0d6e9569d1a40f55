"""Functions the pipeline and composed-plan parity tests run on every rank of a WorkerPool.

Each case builds a Plan (hal.strategies.plan) for a layout on a subset of the 6-rank pool's world
(cuda:3 = ranks 0-2, kunlun:2 = 3-4, ascend:1 = 5, all emulated), applies it with
hal.strategies.apply.apply_plan, trains STEPS SGD steps on the same global batches a single-process run
sees, and returns the full parameters this rank's stage holds (names of the full model) and the loss
per step. The test process runs the single-process reference once and compares.
"""
from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

MODEL_SEED, DATA_SEED = 0, 1
STEPS, LR = 3, 0.5
TOL = 2e-6     # max abs difference of any fp32 parameter from the single-process run (why: test modules)
MOVED = 1e-5   # every parameter must move at least this, and at least 10 x its difference


def init(backend: str = "hetero", timeout_s: float = 60.0) -> dict:
    import hal
    if backend == "hetero":
        import hal.ccl_bridge  # noqa: F401 - registers the backend
    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    acc = hal.accelerator()
    return {"rank": dist.get_rank(), "chip": acc.chip.name, "emulated": acc.emulated,
            "backend": dist.get_backend()}


def build(cfg_kind: str):
    """(config, model) of the named test model, identical on every rank (private seed)."""
    from hal.strategies.models import ModelConfig, build_model
    if cfg_kind == "tiny":  # dense GPT (RMSNorm, rotary attention, SwiGLU), 4 blocks, hidden 32
        cfg = ModelConfig(name="tiny", layers=4, hidden=32, heads=4, ffn=64, vocab=64, seq=16)
        return cfg, build_model(cfg, MODEL_SEED)
    if cfg_kind == "moe":  # the same with a 4-expert top-2 MoE FFN in every block (capacity 1.25: drops),
        # a gated shared expert (dense, replicated: DP-reduced, never expert-parallel) and 2 K/V heads (GQA)
        cfg = ModelConfig(name="tiny-moe", layers=4, hidden=32, heads=4, kv_heads=2, ffn=32, vocab=64, seq=16,
                          experts=4, top_k=2, capacity_factor=1.25, moe_aux_loss_coef=0.01,
                          shared_experts=1, shared_ffn=16, shared_expert_gate=True)
        return cfg, build_model(cfg, MODEL_SEED)
    raise ValueError(f"unknown test model {cfg_kind!r}")


def batches(cfg, global_batch: int) -> torch.Tensor:
    from hal.strategies.models import make_batches
    return make_batches(cfg, STEPS, global_batch, DATA_SEED)  # (steps, global_batch, seq + 1)


def reference(cfg_kind: str, global_batch: int, num_microbatches: int = 1) -> dict:
    """Single process, SGD, the same global batches: final params, initial params, mean loss per step.

    Dense: one forward of the whole global batch with a mean loss. MoE: the global batch in the plan's
    micro-batches with gradient accumulation (hal.strategies.data_parallel.accumulate: each micro-batch's
    summed loss / global tokens, plus aux loss / micro-batches), because a MoE layer's capacity and
    load-balancing statistics are defined per forward, i.e. per micro-batch (hal/strategies/moe.py)."""
    from hal.strategies.data_parallel import accumulate
    from hal.strategies.models import count_tokens, lm_loss
    cfg, model = build(cfg_kind)
    init_state = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    data = batches(cfg, global_batch)
    losses = []
    for step in range(STEPS):
        x, y = data[step, :, :-1], data[step, :, 1:]
        if cfg.experts:
            xs, ys = x.chunk(num_microbatches), y.chunk(num_microbatches)
            losses.append(accumulate(model, xs, ys, count_tokens(y)).item())
        else:
            loss = lm_loss(model(x), y)
            loss.backward()
            losses.append(loss.item())
        opt.step()
        opt.zero_grad()
    return {"params": {n: p.detach().clone() for n, p in model.named_parameters()},
            "init": init_state, "losses": losses}


def train_plan(plan_json: str, cfg_kind: str = "tiny", runtime: str = "auto") -> dict[str, Any]:
    """apply_plan on this rank, STEPS SGD steps; returns held full params and global losses."""
    from hal.strategies.apply import apply_plan
    from hal.strategies.plan import Plan
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
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor
    from torch.nn.parallel import DistributedDataParallel
    wrappers = sorted({"FSDP2" if isinstance(m, FSDPModule) else "DDP" if isinstance(m, DistributedDataParallel)
                       else "plain" for m in run.modules.values()})
    dtensors = sum(isinstance(p, DTensor) for p in run.parameters())
    held = run.full_parameters()
    roles = [(r.stage, r.replica, r.tp_index) for r in run.mesh.roles]
    return {"rank": dist.get_rank(), "roles": roles, "params": held, "losses": losses,
            "wrappers": wrappers, "dtensors": dtensors, "local_params": len(run.parameters()),
            "runtime": type(run.runtime).__name__ if run.runtime is not None else None}


def plan(stages, num_microbatches=2, schedule="1F1B", zero=0, recompute="none") -> str:
    """Plan JSON: stages = [((start, end), [(ranks, microbatch), ...][, experts per replica]), ...]."""
    out = []
    for layers, reps, *experts in stages:
        st = {"layers": list(layers), "recompute": recompute,
              "replicas": [{"ranks": list(r), "microbatch": mb} for r, mb in reps]}
        if experts:
            st["experts"] = experts[0]
        out.append(st)
    return json.dumps({"version": 1, "model": "tiny", "num_microbatches": num_microbatches,
                       "schedule": schedule, "zero": zero, "stages": out})


_refs: dict = {}


def cached_reference(cfg_kind: str, global_batch: int, num_microbatches: int) -> dict:
    """reference(), computed once per test process for each (model, batch, micro-batches)."""
    key = (cfg_kind, global_batch, num_microbatches)
    if key not in _refs:
        _refs[key] = reference(*key)
    return _refs[key]


def check(results, plan_json: str, expect_runtime: str, cfg_kind: str = "tiny") -> None:
    """In the test process: the stages' parameters together are the whole model, DP replicas agree
    exactly, every parameter is within TOL of the single-process run and moved (see MOVED), and every
    rank reported the reference's loss per step."""
    import pytest
    p = json.loads(plan_json)
    global_batch = sum(r["microbatch"] for r in p["stages"][0]["replicas"]) * p["num_microbatches"]
    dense = cfg_kind == "tiny"
    ref = cached_reference(cfg_kind, global_batch, 1 if dense else p["num_microbatches"])
    held = {}
    for r in results:
        if r["roles"]:
            assert r["runtime"] == expect_runtime, r["runtime"]
        for name, t in r["params"].items():
            if name in held:  # DP replicas of one stage must agree exactly (same summed gradient)
                gap = (held[name] - t).abs().max().item()
                assert gap == 0.0, f"replicas disagree on {name} by {gap} (rank {r['rank']})"
            held[name] = t
    assert sorted(held) == sorted(ref["params"]), "the stages together must hold the whole model"
    diffs = {n: (held[n] - ref["params"][n]).abs().max().item() for n in held}
    moved = {n: (ref["params"][n] - ref["init"][n]).abs().max().item() for n in held}
    worst = {n: d for n, d in diffs.items() if d > TOL}
    assert not worst, f"parameters off the single-process run by more than {TOL}: {worst}"
    still = {n: (m, diffs[n]) for n, m in moved.items() if m < max(10 * diffs[n], MOVED)}
    assert not still, f"parameters that barely trained, (moved, diff) (the comparison has no teeth): {still}"
    for r in results:  # every rank returns the global mean loss of each step
        assert r["losses"] == pytest.approx(ref["losses"], abs=1e-5)


def expect_error(plan_json: str, runtime: str = "auto", rows: int = 0) -> dict:
    """apply_plan (and, with rows > 0, one step on a batch of that many rows) must raise; returns the
    error's type and message on this rank ({} on a rank where nothing was raised)."""
    from hal.strategies.apply import apply_plan
    from hal.strategies.plan import Plan
    plan = Plan.from_json(plan_json)
    cfg, model = build("tiny")
    try:
        run = apply_plan(model, plan, runtime=runtime, timeout=timedelta(seconds=60))
        if rows:
            x = torch.zeros(rows, cfg.seq, dtype=torch.int64)
            run.step(x, x)
    except Exception as exc:  # the type and message are what the test checks
        return {"type": type(exc).__name__, "message": str(exc)}
    return {}
