"""Checkpoints of a `hal train` run with torch.distributed.checkpoint (DCP): this rank's model and
optimizer state (torch's `get_state_dict`, so DDP / FSDP2 / TP wrappers are unwrapped to the model's
own parameter names), the step, and every rank's RNG state, under `<dir>/step_<N>/`. Rank 0 marks a
checkpoint complete (`.complete`) only after every rank has written, so a run killed mid-save resumes
from the previous one. The lr schedule and the data position are pure functions of the step
(trainer.config.lr_at, trainer.data.train_batch), so the step restores both.

Not built yet: asynchronous save (dcp.async_save) and resharding onto a different plan or cluster
(the parameter names are the full model's, which is what resharding needs, but it is untested).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

MARK = ".complete"


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def latest(root: Path) -> Optional[int]:
    """The step of the newest complete checkpoint under `root`, None when there is none."""
    if not root.is_dir():
        return None
    steps = [int(p.name[5:]) for p in root.glob("step_*") if (p / MARK).is_file() and p.name[5:].isdigit()]
    return max(steps) if steps else None


def _module(run):
    mods = list(run.modules.values())
    if len(mods) > 1:
        raise NotImplementedError(f"rank {dist.get_rank()} holds {len(mods)} stages (interleaved schedule): "
                                  f"checkpointing several stages per rank is not built yet")
    return mods[0] if mods else None


def _state(run, opt) -> dict:
    mod = _module(run)
    state: dict = {f"rng_rank{dist.get_rank()}": torch.get_rng_state()}
    if mod is not None:
        model_sd, optim_sd = get_state_dict(mod, opt)
        state["model"], state["optim"] = model_sd, optim_sd
    return state


def save(root: Path, step: int, run, opt, group) -> Path:
    """Collective over `group` (the world): write this rank's share of step `step`'s checkpoint."""
    path = step_dir(root, step)
    state = _state(run, opt)
    state["step"] = torch.tensor(step)
    dcp.save(state, checkpoint_id=str(path), process_group=group)
    dist.barrier(group=group)
    if dist.get_rank() == 0:
        (path / MARK).write_text(f"{step}\n")
    dist.barrier(group=group)
    return path


def load(root: Path, step: int, run, opt, group) -> int:
    """Collective: restore model, optimizer and this rank's RNG from step `step`'s checkpoint; returns
    the step stored in it."""
    path = step_dir(root, step)
    state = _state(run, opt)
    state["step"] = torch.tensor(-1)
    dcp.load(state, checkpoint_id=str(path), process_group=group)
    mod = _module(run)
    if mod is not None:
        hyper = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
        set_state_dict(mod, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        # torch 2.13 + DCP drops the float hyperparameters (lr, betas, eps, weight_decay) of a pipeline
        # stage's param group on load (seen on stage 0 of a 2-stage plan, not on the last stage); they
        # come from the config (lr from the step) anyway, so put back what the load left out
        for g, h in zip(opt.param_groups, hyper):
            for k, v in h.items():
                g.setdefault(k, v)
    torch.set_rng_state(state[f"rng_rank{dist.get_rank()}"])
    return int(state["step"])
