"""Functions the data-parallel parity tests (tests/test_strategies_dp.py) run on every rank of a
WorkerPool: train the GPT of examples/models/tiny.toml a few SGD steps with DDP or FSDP2 laid out by a
Plan (uneven rows per rank, several micro-batches), on a `hetero` subgroup of the pool's world, and
compare what this rank holds with a single-process run on the same global batch computed right here.

SGD, not Adam: Adam's update is invariant to the gradient's scale, so a wrongly weighted or doubly
averaged gradient could still match; SGD's cannot.
"""
from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from hal.strategies.models import ModelConfig, build_model, lm_loss, make_batches
from hal.strategies.plan import Plan

CFG = ModelConfig.from_toml(Path(__file__).resolve().parents[1] / "examples" / "models" / "tiny.toml")
MODEL_SEED, DATA_SEED = 0, 1
STEPS, LR = 3, 2.0

_groups: dict[tuple, dist.ProcessGroup] = {}
_refs: dict[int, tuple] = {}


def init(backend: str, timeout_s: float = 60.0) -> dict:
    """Join the default group once per worker; report this rank's chip and the group's backend."""
    import hal
    if backend == "hetero":
        import hal.ccl_bridge  # noqa: F401 - registers the backend
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    acc = hal.accelerator()
    return {"rank": dist.get_rank(), "chip": acc.chip.name, "emulated": acc.emulated,
            "backend": dist.get_backend()}


def _group(ranks: tuple) -> dist.ProcessGroup:
    """The world, or a new_group of it (every rank of the world must call this); cached per rank set."""
    if list(ranks) == list(range(dist.get_world_size())):
        return dist.group.WORLD
    if ranks not in _groups:
        _groups[ranks] = dist.new_group(list(ranks))
    return _groups[ranks]


def reference(global_batch: int) -> tuple[dict, list[float], dict]:
    """Single process, whole global batch in one forward, mean loss: (final params, losses, initial params)."""
    if global_batch not in _refs:
        model = build_model(CFG, MODEL_SEED)
        init_state = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        data = make_batches(CFG, STEPS, global_batch, DATA_SEED)
        losses = []
        for step in range(STEPS):
            loss = lm_loss(model(data[step, :, :-1]), data[step, :, 1:])
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        _refs[global_batch] = ({n: p.detach().clone() for n, p in model.named_parameters()}, losses, init_state)
    return _refs[global_batch]


def train_dp(plan_json: str, ranks: tuple, strategy: str, return_params: bool = False) -> dict:
    """Train STEPS steps on `ranks` (a hetero subgroup; plan rank i = ranks[i]) as `plan_json` says.

    strategy: "ddp" / "fsdp" (the plan's zero level): global-token normalisation, averaging off;
    "ddp-mean": the naive alternative (each rank's mean loss, DDP's averaging on) as a control."""
    from hal.strategies.data_parallel import accumulate, global_token_count, replica_microbatches, wrap_ddp
    from hal.strategies.sharded_data_parallel import full_state, mesh_from_group, shard_fsdp2
    from hal.strategies.models import count_tokens

    group = _group(tuple(ranks))
    if dist.get_rank() not in ranks:
        return {"member": False}
    plan = Plan.from_json(plan_json)
    role = plan.role(ranks.index(dist.get_rank()))
    rows = plan.rows(role.stage, role.replica)
    model = build_model(CFG, MODEL_SEED)
    if strategy == "fsdp":
        shard_fsdp2(model, model.blocks, mesh_from_group(group, "cpu"), zero=plan.zero, sum_gradients=True)
    else:
        model = wrap_ddp(model, group, bucket_cap_mb=0.02, sum_gradients=strategy == "ddp")
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    data = make_batches(CFG, STEPS, plan.global_batch, DATA_SEED)
    losses, tokens = [], []
    for step in range(STEPS):
        micro = replica_microbatches(data[step], plan.num_microbatches, rows)
        xs, ys = [m[:, :-1] for m in micro], [m[:, 1:] for m in micro]
        n = global_token_count(ys, group) if strategy != "ddp-mean" else sum(count_tokens(y) for y in ys)
        share = accumulate(model, xs, ys, n).reshape(1)
        dist.all_reduce(share, group=group)
        opt.step()
        opt.zero_grad()
        losses.append(share.item() / (len(ranks) if strategy == "ddp-mean" else 1))
        tokens.append(n)
    held = full_state(model) if strategy == "fsdp" else {n: p.detach() for n, p in model.module.named_parameters()}
    ref, ref_losses, init_state = reference(plan.global_batch)
    out = {"member": True, "rows": rows, "microbatches": plan.num_microbatches, "tokens": tokens,
           "max_param_diff": max((held[k] - ref[k]).abs().max().item() for k in ref),
           "min_moved": min((ref[k] - init_state[k]).abs().max().item() for k in ref),
           "names": sorted(held) == sorted(ref), "losses": losses, "ref_losses": ref_losses,
           "sharded": strategy == "fsdp" and all(hasattr(p, "full_tensor") for p in model.parameters())}
    if return_params:
        out["params"] = {k: v.clone() for k, v in held.items()}
    return out
