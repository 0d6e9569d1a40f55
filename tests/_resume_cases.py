"""Rank-side cases of tests/test_trainer_resume.py, run in hal.testing.worker_pool workers: a `hal train`
run from a config dict, and "lay the model out as this config says, load checkpoint step k into it, and
return every full parameter and AdamW moment this rank now holds" (what a resharded load must restore)."""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from hal.trainer.config import TrainConfig
from hal.trainer.loop import train


def run(config: dict) -> dict:
    return train(TrainConfig(**config), digest=True)  # the tests compare parameter digests


def load_full(config: dict, step: int) -> dict:
    """The trainer's set-up (hal.trainer.trainer.Trainer: plan, model, apply_plan, AdamW) without training, then
    Checkpointer.load(step); returns {"model.<fqn>": full tensor, "optim.state.<fqn>.<key>": full tensor}
    for this rank's stages, and the plan's description."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    import hal
    from hal.strategies.apply import apply_plan
    from hal.strategies.models import build_model
    from hal.trainer import checkpoint as ckpt
    from hal.trainer.elastic import live_topology
    from hal.trainer.trainer import init_distributed, make_plan

    cfg = TrainConfig(**config)
    init_distributed(cfg)
    rank, world = dist.get_rank(), dist.get_world_size()
    book = dist.new_group(backend="gloo", timeout=timedelta(seconds=cfg.timeout_s))
    topo = live_topology(world, book)
    model_cfg = cfg.load_model_config()
    plan = make_plan(cfg, topo, model_cfg, book)
    chips = [None] * world
    dist.all_gather_object(chips, {"rank": rank, "chip": hal.accelerator().chip.name, "emulated": True}, group=book)
    torch.manual_seed(cfg.seed)
    model = build_model(model_cfg, cfg.seed)
    run_ = apply_plan(model, plan, topo, model_cfg=model_cfg, timeout=timedelta(seconds=cfg.timeout_s))
    params = run_.parameters()
    opt = torch.optim.AdamW(params, lr=1.0, foreach=False) if params else None
    saver = ckpt.Checkpointer(cfg.checkpoint_dir, run_, opt, plan, chips, cfg.timeout_s)
    resumed = saver.load(step)
    out: dict = {}
    if saver.parts is not None:
        full = StateDictOptions(flatten_optimizer_state_dict=True, full_state_dict=True)
        model_sd, optim_sd = get_state_dict(saver.parts, opt, options=full)
        out.update({f"model.{k}": v.detach().clone() for k, v in model_sd.items()})
        out.update({f"optim.{k}": v.detach().clone() for k, v in optim_sd.items()
                    if k.startswith("state.") and isinstance(v, torch.Tensor)})
    return {"rank": rank, "stages": sorted(run_.modules), "state": out, "resharded": resumed.resharded,
            "step": resumed.step, "wrappers": sorted({type(m).__name__ for m in run_.modules.values()})}
