"""`hal train --config train.toml`: train one model across a (mixed) cluster as the config says
(trainer.config). Not under torchrun, it launches itself through torchrun on this machine with one
rank per rank of the configured cluster (`cluster.emulate`, `cluster.spec`, else HAL_EMULATE /
HAL_CLUSTER); under torchrun (a real cluster: each node runs torchrun, docs/mixed-cluster.md) it
runs the loop directly.

examples:
  hal train --config examples/train/tiny.toml
  hal train --config examples/train/tiny.toml --steps 100 --run-dir runs/short
  hal train --config examples/train/tiny.toml --plan auto

Writes <run dir>/metrics.jsonl, summary.json and checkpoints/ (docs/training.md).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

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


def _world(cfg, env: dict) -> int:
    from hal.cluster import load_cluster_spec
    from hal.topology import Topology
    if cfg.cluster.spec:
        return Topology.from_spec(load_cluster_spec(cfg.resolve(cfg.cluster.spec))).world_size
    return Topology.from_env(env).world_size


def run(args: argparse.Namespace) -> int:
    from hal.errors import HalError
    try:
        cfg = load(args)
    except HalError as exc:
        print(f"hal train: error: {exc}", file=sys.stderr)
        return 2
    if os.environ.get("TORCHELASTIC_RUN_ID") or ("RANK" in os.environ and "WORLD_SIZE" in os.environ):
        from .elastic import exit_failed
        from .loop import train
        try:
            train(cfg, log=lambda s: print(s, flush=True))
        except BaseException as exc:  # exit now; torchrun restarts the job (trainer/elastic.py)
            exit_failed(exc)
        return 0
    env = dict(os.environ)
    if cfg.cluster.emulate:
        env["HAL_EMULATE"] = cfg.cluster.emulate
    elif cfg.cluster.spec:
        env["HAL_CLUSTER"] = str(cfg.resolve(cfg.cluster.spec))
    try:
        nproc = _world(cfg, env)
    except HalError as exc:
        print(f"hal train: error: cluster: {exc} (set cluster.emulate or cluster.spec in the config, or "
              f"HAL_EMULATE / HAL_CLUSTER)", file=sys.stderr)
        return 2
    env.setdefault("OMP_NUM_THREADS", "1")
    from hal.testing import free_port  # the one free-port helper (hal.testing exports it)
    if getattr(args, "max_restarts", 0) < 0:
        print(f"hal train: error: --max-restarts {args.max_restarts}: must be >= 0", file=sys.stderr)
        return 2
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
           "--max-restarts", str(getattr(args, "max_restarts", 0)),
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "trainer.loop",
           "--config", os.path.abspath(args.config)]
    for k in _OVERRIDES:
        v = getattr(args, k, None)
        if v is not None:
            cmd += [f"--{k.replace('_', '-')}", str(os.path.abspath(v) if k == "run_dir" else v)]
    emulated = bool(env.get("HAL_EMULATE"))
    print(f"hal train: launching {nproc} ranks on this machine through torchrun"
          + (f" (HAL_EMULATE={env['HAL_EMULATE']}: every chip EMULATED on this host's CPU)" if emulated else ""),
          flush=True)
    t0 = time.perf_counter()
    code = subprocess.call(cmd, env=env)
    print(f"hal train: {'done' if code == 0 else f'FAILED (exit code {code})'} in {time.perf_counter() - t0:.0f} s")
    return code


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hal train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))
