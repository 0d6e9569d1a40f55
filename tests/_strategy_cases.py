"""Functions the strategy parity tests run on every rank of a WorkerPool (importable by module path).

Each case trains a small GPT (hal.strategies.models, every op through hal.ops) a few SGD steps with one of torch's strategies (DDP,
FSDP2, pipelining) on the default process group, then compares what this rank holds with a
single-process run of the same model and data (same seeds) computed right here on the rank. It returns
plain floats and strings, so the test process asserts on small picklable values.

SGD, not Adam, on purpose: Adam's update is invariant to the gradient's scale, so a strategy that
summed gradients instead of averaging them would still match; SGD's would not.
"""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from hal.strategies.apply import StageModule
from hal.strategies.models import ModelConfig, build_model, lm_loss, make_batches, rank_slice

CFG = ModelConfig(name="parity", layers=4, hidden=32, heads=4, ffn=64, vocab=64, seq=16)
MODEL_SEED, DATA_SEED = 0, 1
STEPS, GLOBAL_BATCH, LR = 6, 8, 0.5  # every parameter moves >= 1.9e-4 (the tests ask 10 x their 1e-5)

_groups: dict[tuple, dist.ProcessGroup] = {}


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


def _subgroup(ranks: tuple) -> dist.ProcessGroup:
    """A new_group of the world (every rank must call this, members or not); cached per rank set."""
    if ranks not in _groups:
        _groups[ranks] = dist.new_group(list(ranks))
    return _groups[ranks]


def reference(steps: int = STEPS) -> tuple[dict[str, torch.Tensor], list[float], dict[str, torch.Tensor]]:
    """Single-process run: (final params, loss per step, initial params)."""
    model = build_model(CFG, MODEL_SEED)
    init_state = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    data = make_batches(CFG, steps, GLOBAL_BATCH, DATA_SEED)
    losses = []
    for step in range(steps):
        loss = lm_loss(model(data[step, :, :-1]), data[step, :, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {n: p.detach().clone() for n, p in model.named_parameters()}, losses, init_state


def _compare(held: dict[str, torch.Tensor], losses: list[float]) -> dict:
    """Max abs difference of the parameters this rank holds (and its losses) against the reference."""
    ref, ref_losses, init_state = reference()
    missing = sorted(set(held) - set(ref))
    if missing:
        raise KeyError(f"rank {dist.get_rank()}: parameters {missing} are not in the reference model")
    return {"names": sorted(held),
            "max_param_diff": max((held[n] - ref[n]).abs().max().item() for n in held),
            "param_diffs": {n: (held[n] - ref[n]).abs().max().item() for n in held},
            "moved": {n: (ref[n] - init_state[n]).abs().max().item() for n in held},
            "losses": losses, "ref_losses": ref_losses}


def _world_mean(value: torch.Tensor, group=None) -> float:
    t = value.detach().clone().reshape(1)
    dist.all_reduce(t, group=group)
    return t.item() / dist.get_world_size(group)


def split_stages(model, num_stages: int) -> list[StageModule]:
    """The model's blocks cut into `num_stages` contiguous runs (the first ones one longer when uneven),
    each a StageModule holding the full model's parameter names."""
    base, extra = divmod(model.cfg.layers, num_stages)
    stages, start = [], 0
    for i in range(num_stages):
        n = base + (1 if i < extra else 0)
        stages.append(StageModule(model, (start, start + n), i == 0, i == num_stages - 1))
        start += n
    return stages


def train_ddp() -> dict:
    from hal.strategies.data_parallel import wrap_ddp
    rank, world = dist.get_rank(), dist.get_world_size()
    model = wrap_ddp(build_model(CFG, MODEL_SEED), bucket_cap_mb=0.05)  # several buckets, overlapped
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    data = make_batches(CFG, STEPS, GLOBAL_BATCH, DATA_SEED)
    losses = []
    for step in range(STEPS):
        mine = rank_slice(data[step], rank, world)
        loss = lm_loss(model(mine[:, :-1]), mine[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(_world_mean(loss))
    return _compare({n: p.detach() for n, p in model.module.named_parameters()}, losses)


def train_fsdp2() -> dict:
    from torch.distributed.tensor import DTensor

    from hal.strategies.sharded_data_parallel import full_state, mesh_from_group, shard_fsdp2
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model(CFG, MODEL_SEED)
    mesh = mesh_from_group(dist.group.WORLD, "cpu")
    shard_fsdp2(model, model.blocks, mesh)
    sharded = sum(isinstance(p, DTensor) for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    data = make_batches(CFG, STEPS, GLOBAL_BATCH, DATA_SEED)
    losses = []
    for step in range(STEPS):
        mine = rank_slice(data[step], rank, world)
        loss = lm_loss(model(mine[:, :-1]), mine[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(_world_mean(loss))
    out = _compare(full_state(model), losses)
    out["sharded_params"] = sharded
    return out


def train_pipeline(schedule: str, ranks: tuple, n_microbatches: int) -> dict:
    from hal.strategies.pipeline_parallel import build_pipeline, pipeline_step
    group = dist.group.WORLD if len(ranks) == dist.get_world_size() else _subgroup(ranks)
    if dist.get_rank() not in ranks:
        return {"member": False}
    model = build_model(CFG, MODEL_SEED)
    num_stages = len(ranks)
    my_stage = split_stages(model, num_stages)[dist.get_rank(group)]
    stage, sched = build_pipeline(my_stage, group, n_microbatches, lm_loss, schedule)
    opt = torch.optim.SGD(my_stage.parameters(), lr=LR)
    data = make_batches(CFG, STEPS, GLOBAL_BATCH, DATA_SEED)
    losses = []
    for step in range(STEPS):
        loss = pipeline_step(stage, sched, data[step, :, :-1], data[step, :, 1:])
        opt.step()
        opt.zero_grad()
        if loss is not None:
            losses.append(loss.item())
    out = _compare({n: p.detach() for n, p in my_stage.named_parameters()}, losses)
    out.update(member=True, stage=dist.get_rank(group), is_last=stage.is_last)
    return out

