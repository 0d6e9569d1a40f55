"""`hal demo`: the main job. Starts an emulated mixed cluster on this machine with torchrun (default
2 cuda + 2 ascend ranks, every one EMULATED on this host's CPU), trains a small GPT on bytes of the
Python standard library through the `hal train` Trainer with torch's DDP over the `hetero` process group
for a few hundred steps, then prints the loss curve, its parity with a single-process run of the same
model and data (max abs difference of the final parameters) and which chip each rank emulated.

examples:
  hal demo                                   # 300 steps, cuda:2,ascend:2, backend hetero
  hal demo --steps 100 --emulate cuda:3,ascend:1
  hal demo --nproc 6                         # cuda:3,ascend:3
  hal demo --backend gloo                    # the same job on flat gloo, for comparison

Every flag and the chip environment (HAL_EMULATE, HAL_CLUSTER, HAL_CHIP, HAL_PLUGINS) are checked
before torchrun starts (hal.launch.check); the rank count comes from --nproc, the emulation map or the
cluster spec (`HAL_CLUSTER=examples/clusters/laptop-2x2.toml hal demo` starts its 4 ranks). If a rank
fails, the first failing rank's error is printed once, with the path of the full log of every rank.

exit codes: 0 trained with parity; 1 parity failed or a rank failed; 2 bad input (nothing started).

The rank job is the module `hal.cli.demo_job`, started by name in the torchrun ranks; it runs
hal.trainer's Trainer in a temporary run folder, removed at the end. Both live in hal/cli/, above every
library package, so `hal` (which names this module in its subcommand table and imports it only when
`hal demo` is chosen) imports nothing above it.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

DEFAULT_EMULATE = "cuda:2,ascend:2"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    p.add_argument("--nproc", type=int, default=None,
                   help="ranks to start on this machine (default: the count in --emulate, i.e. 4)")
    p.add_argument("--emulate", default=None, metavar="MAP",
                   help=f"chip of each rank, e.g. cuda:3,ascend:1 (default {DEFAULT_EMULATE}; with only "
                        f"--nproc N: half cuda, half ascend; HAL_EMULATE / HAL_CLUSTER in the environment "
                        f"are respected when --emulate is not given)")
    p.add_argument("--backend", default="hetero", choices=("hetero", "gloo"),
                   help="process group for DDP (default hetero; gloo = flat gloo, for comparison)")
    p.add_argument("--global-batch", type=int, default=16,
                   help="sequences per step over all ranks; rounded to a multiple of the ranks (default 16)")
    p.add_argument("--tolerance", type=float, default=1e-4,
                   help="max abs difference of the final parameters accepted as parity (default 1e-4)")
    p.add_argument("--timeout", type=float, default=120.0, help="collective timeout in seconds (default 120)")


def _default_emulate(nproc):
    """--nproc N alone: half cuda, half ascend (4 ranks: the default map)."""
    n = 4 if nproc is None else nproc
    if n < 2:
        from hal.launch.check import LaunchError
        raise LaunchError(f"--nproc {n}: the default mixed cluster needs at least 2 ranks (one cuda, one "
                          f"ascend); for one rank name its chip, e.g. --emulate cuda:1")
    return DEFAULT_EMULATE if n == 4 else f"cuda:{(n + 1) // 2},ascend:{n // 2}"


def plan(args: argparse.Namespace, environ: dict) -> tuple:
    """(nproc, env for the ranks, how the chips were chosen, (chip, emulated) per rank): every flag and
    chip variable checked here, before torchrun starts (hal.launch.check; LaunchError names the flag or variable)."""
    from hal.launch.check import check_float, check_int, plan_ranks
    check_int("--steps", args.steps, 1, 10_000_000)
    check_int("--global-batch", args.global_batch, 1, 1_000_000)
    check_float("--tolerance", args.tolerance, 0.0)
    check_float("--timeout", args.timeout, 0.0, 86_400.0)
    # a mixed cluster needs 2 ranks, but a user's own HAL_EMULATE=cuda:1 is a fine 1-rank job
    nproc, env, source, chips = plan_ranks(args.nproc, args.emulate, environ, _default_emulate, min_ranks=1)
    env.setdefault("OMP_NUM_THREADS", "1")  # the ranks share this machine's cores
    return nproc, env, source, chips


def run(args: argparse.Namespace) -> int:
    from hal.contract.errors import HalError
    from hal.launch.check import fail, run_ranks
    from hal.testing import free_port
    try:
        nproc, env, source, chips = plan(args, os.environ)
    except HalError as exc:
        return fail("hal demo", exc)
    per_rank = max(1, args.global_batch // nproc)
    global_batch = per_rank * nproc
    emulated = all(e for _, e in chips)
    print(f"hal demo: {nproc} ranks on this machine, chips {source}")
    if emulated:
        print(f"  EMULATED: no accelerator is used. Each rank runs its chip's identity, profile and ops on this "
              f"host's CPU ({os.cpu_count()} cores), with the CPU fabric standing in for its vendor CCL; "
              f"the `{args.backend}` group bridges the sub-clusters exactly as it would real ones.")
    chip_env = " ".join(f"{k}={env[k]}" for k in ("HAL_EMULATE", "HAL_CLUSTER", "HAL_CHIP") if env.get(k))
    print(f"  launching: {chip_env} torchrun --nproc-per-node {nproc} "
          f"-m hal.cli.demo_job --steps {args.steps} --global-batch {global_batch} --backend {args.backend}",
          flush=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hal-demo-") as run_dir:  # the trainer's metrics and model file
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
               "-m", "hal.cli.demo_job", "--steps", str(args.steps), "--global-batch", str(global_batch),
               "--backend", args.backend, "--tolerance", str(args.tolerance), "--timeout", str(args.timeout),
               "--run-dir", run_dir]
        code = run_ranks("hal demo", cmd, env)
    verdict = "done" if code == 0 else f"FAILED (exit code {code})"
    print(f"hal demo: {verdict} in {time.perf_counter() - t0:.0f} s"
          + (" (all chips emulated)" if emulated else ""))
    return code
