"""The command line of a training run: `--config` and its overrides, shared by the launcher
(`hal train`, hal/cli/train.py) and the rank entry (`python -m hal.trainer.loop`), so a flag means the
same on both sides of torchrun."""
from __future__ import annotations

import argparse
import os

_OVERRIDES = ("steps", "stop_after", "run_dir", "plan", "seed")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="train.toml", help="the run's config (examples/train/); required")
    p.add_argument("--check-checkpoints", metavar="DIR", help="only list each checkpoint in DIR (a checkpoint "
                   "or run folder): ok / incomplete / corrupt and why; exit 0 when the newest complete one is good, "
                   "1 otherwise, 2 for no checkpoint folder (hal.trainer.integrity)")
    p.add_argument("--steps", type=int, help="override `steps` (the schedule's length)")
    p.add_argument("--stop-after", type=int, help="stop at this step, checkpointed, schedule unchanged")
    p.add_argument("--run-dir", help="override log.dir (metrics, summary, checkpoints)")
    p.add_argument("--plan", help="override the plan: even, auto, or a plan file (TOML/JSON)")
    p.add_argument("--seed", type=int, help="override `seed`")
    p.add_argument("--max-restarts", type=int, default=0, metavar="N",
                   help="torchrun --max-restarts: restart the job up to N times after a rank fails; each restart "
                        "resumes from the newest complete checkpoint (docs/training.md, faults)")
    nodes = p.add_argument_group("several nodes (the same command on every node; hal.launch.nodes)")
    nodes.add_argument("--nnodes", type=int, help="nodes in the job (torchrun's --nnodes); default: Slurm's "
                       "SLURM_NNODES under srun, else len(cluster.nodes), else 1")
    nodes.add_argument("--node-rank", type=int, help="this node's index 0..nnodes-1 (torchrun's --node-rank)")
    nodes.add_argument("--rdzv-endpoint", metavar="HOST[:PORT]",
                       help="node 0's address (port default 29400; port + 1 carries the pre-launch checks)")
    nodes.add_argument("--node-timeout", type=float, default=300.0, metavar="S",
                       help="seconds to wait for every node's pre-launch checks (default 300)")
    p.add_argument("--measure-parts", action="store_true",
                   help="first run each sub-cluster alone (planned for itself) and Plan.even for a few steps, "
                        "so the run ends with its mixed-cluster efficiency (hal/trainer/parts.py)")


def load(args: argparse.Namespace):
    """The config with the command line's overrides, validated (TrainConfigError names the field)."""
    from .config import TrainConfig, TrainConfigError
    if not args.config:
        raise TrainConfigError("(file)", None, "--config train.toml is required (but with --check-checkpoints DIR)")
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


def config_env(cfg, environ) -> dict:
    """The environment a rank runs under: `environ` with the chips and the timing the config sets
    (cluster.emulate -> HAL_EMULATE, cluster.spec -> HAL_CLUSTER, either drops HAL_CHIP; cluster.timed
    -> HAL_EMULATE_TIMED=1, cluster.time_scale -> HAL_EMULATE_TIME_SCALE, cluster.timed_dtype ->
    HAL_EMULATE_TIMED_DTYPE). The launcher and every rank apply this one rule, so a node's ranks get the
    config's settings whatever its launcher's environment (docs/mixed-cluster.md)."""
    env = dict(environ)
    c = cfg.cluster
    if c.emulate or c.spec:
        env.pop("HAL_CHIP", None)  # HAL_CHIP would bind that one chip on every rank
    if c.emulate:
        env["HAL_EMULATE"] = c.emulate
    elif c.spec:
        env.pop("HAL_EMULATE", None)
        env["HAL_CLUSTER"] = str(cfg.resolve(c.spec))
    if c.timed:
        env["HAL_EMULATE_TIMED"] = "1"
        if c.time_scale:
            env["HAL_EMULATE_TIME_SCALE"] = repr(c.time_scale)
        if c.timed_dtype:
            env["HAL_EMULATE_TIMED_DTYPE"] = c.timed_dtype
    return env


def apply_config_env(cfg) -> None:
    """In a rank, before any chip binds: os.environ as `config_env` says."""
    new = config_env(cfg, os.environ)
    for k in set(os.environ) - set(new):
        del os.environ[k]
    os.environ.update(new)
