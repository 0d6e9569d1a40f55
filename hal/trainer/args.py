"""The command line of a training run: `--config` and its overrides, shared by the launcher
(`hal train`, hal/cli/train.py) and the rank entry (`python -m hal.trainer.loop`), so a flag means the
same on both sides of torchrun."""
from __future__ import annotations

import argparse
import os

_OVERRIDES = ("steps", "stop_after", "run_dir", "plan", "seed")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, metavar="train.toml", help="the run's config (examples/train/)")
    p.add_argument("--steps", type=int, help="override `steps` (the schedule's length)")
    p.add_argument("--stop-after", type=int, help="stop at this step, checkpointed, schedule unchanged")
    p.add_argument("--run-dir", help="override log.dir (metrics, summary, checkpoints)")
    p.add_argument("--plan", help="override the plan: even, auto, or a plan file (TOML/JSON)")
    p.add_argument("--seed", type=int, help="override `seed`")
    p.add_argument("--max-restarts", type=int, default=0, metavar="N",
                   help="torchrun --max-restarts: restart the job up to N times after a rank fails; each restart "
                        "resumes from the newest complete checkpoint (docs/training.md, faults)")
    p.add_argument("--measure-parts", action="store_true",
                   help="first run each sub-cluster alone (planned for itself) and Plan.even for a few steps, "
                        "so the run ends with its mixed-cluster efficiency (hal/trainer/parts.py)")


def load(args: argparse.Namespace):
    """The config with the command line's overrides, validated (TrainConfigError names the field)."""
    from .config import TrainConfig
    cfg = TrainConfig.from_toml(args.config)
    data = cfg.model_dump()
    for k in ("steps", "stop_after", "seed"):
        if getattr(args, k, None) is not None:
            data[k] = getattr(args, k)
    if getattr(args, "run_dir", None):
        data["log"]["dir"] = os.path.abspath(args.run_dir)
    if getattr(args, "plan", None):
        data["plan"]["source"] = args.plan if args.plan in ("even", "auto") else "file"
        if data["plan"]["source"] == "file":
            data["plan"]["file"] = os.path.abspath(args.plan)
    return TrainConfig(**data)
