"""`hal bench comm`: an nccl-tests style table (size, count, type, time, algbw, busbw, #wrong) for one
collective on a chosen process group, on this machine's ranks.

Run outside torchrun, it launches itself through torchrun on this machine
(`python -m torch.distributed.run --nproc-per-node N ...`), emulating chips per `--emulate`; under
torchrun (on one node or many) it measures the ranks it was started with.

examples:
  hal bench comm                                      # all_reduce on hetero, 2 cuda + 2 ascend emulated
  hal bench comm --backend gloo                       # the same on flat gloo: the baseline
  hal bench comm --op all_gather --min-bytes 1M --max-bytes 64M --step-factor 4
  hal bench comm --backend vendor --emulate cuda:4    # the chip's own CCL (emulated: the CPU fabric)
  hal bench comm --dtype bfloat16 --iters 20 --repeats 7 --json allreduce.json
  hal bench comm --stages --max-bytes 64M            # hetero vs its own stage model
  hal bench comm --baseline gloo --max-bytes 64M     # hetero and flat gloo in one job, with ratios
  hal bench comm --op all_to_all --uneven --baseline gloo   # MoE-like uneven all_to_all splits
  torchrun --nnodes 2 --nproc-per-node 8 ... -m hal.cli.bench comm --backend hetero   # real nodes

The measurement is hal/bench/comm.py on the harness hal/bench/harness.py (sizes, medians, nccl-tests
bus bandwidth from hal.core.efficiency, the table), which every benchmark in benchmarks/ shares.

exit codes: 0 measured, every result right (#wrong 0); 1 a wrong result or a rank failed (the first
failing rank's error is printed once, with the log of every rank); 2 bad input (nothing started).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import socket
import sys
from typing import Mapping, Optional

from hal import envs

DEFAULT_EMULATE = "cuda:2,ascend:2"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="bench", metavar="BENCH")
    c = sub.add_parser("comm", help="collective bandwidth table (nccl-tests style)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_comm_arguments(c)


def add_comm_arguments(c: argparse.ArgumentParser) -> None:
    from hal.bench.comm import BACKENDS, DTYPES, OPS
    c.add_argument("--op", default="all_reduce", choices=OPS, help="collective (default all_reduce)")
    c.add_argument("--backend", default="hetero", choices=BACKENDS,
                   help="group under test: gloo = flat gloo over every rank (today's mixed-cluster "
                        "baseline); hetero = the bridge; shm = the shared-memory CPU fabric; vendor = "
                        "each chip's own CCL via hal (one group per sub-cluster on a mixed cluster). "
                        "Default hetero")
    c.add_argument("--min-bytes", "-b", default="4K", help="smallest message (default 4K; K/M/G = 2^10/20/30)")
    c.add_argument("--max-bytes", "-e", default="16M",
                   help="largest message (default 16M: the default run takes seconds, not minutes; "
                        "nccl-tests' usual -e 256M works too)")
    c.add_argument("--step-factor", "-f", type=float, default=2.0, help="size multiplier (default 2)")
    c.add_argument("--dtype", "-d", default="float32", choices=DTYPES, help="default float32")
    c.add_argument("--iters", "-n", type=int, default=8, help="operations per timed repeat (default 8)")
    c.add_argument("--warmup", "-w", type=int, default=2, help="untimed operations per size (default 2)")
    c.add_argument("--repeats", "-r", type=int, default=5,
                   help="timed repeats per size; the table shows their median (default 5)")
    c.add_argument("--no-check", action="store_true", help="skip the correctness check (#wrong = 0)")
    c.add_argument("--uneven", action="store_true",
                   help="all_to_all only: uneven splits, rank r sends (1 + (r + j) mod n) / (n(n+1)/2) of its "
                        "buffer to rank j (the shape of a MoE token exchange)")
    c.add_argument("--baseline", default=None, choices=BACKENDS,
                   help="also measure this backend in the same job, size by size, and print the time ratio "
                        "baseline / --backend (e.g. --baseline gloo: how much faster hetero is than flat gloo)")
    c.add_argument("--stages", action="store_true",
                   help="also time the bridge's all_reduce stages one by one (intra reduce-scatter, rail "
                        "all_reduce, intra all_gather) and compare hetero with that model "
                        "(needs --backend hetero --op all_reduce and equal sub-clusters)")
    c.add_argument("--nproc", type=int, default=None,
                   help="ranks to launch on this machine when not under torchrun (default: the count in "
                        "--emulate, else 4)")
    c.add_argument("--emulate", default=None, metavar="MAP",
                   help=f"chips per rank for the launched ranks, e.g. cuda:2,ascend:2 (default "
                        f"{DEFAULT_EMULATE} unless HAL_EMULATE, HAL_CLUSTER or HAL_CHIP is set; 'none' = "
                        f"native chips)")
    c.add_argument("--timeout", type=float, default=300.0, help="collective timeout in seconds (default 300)")
    c.add_argument("--json", metavar="FILE", default=None, help="also write the rows and run facts to FILE")


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ)


def _argv(args: argparse.Namespace) -> list[str]:
    """The options of this run, to hand to the launched ranks."""
    out = ["comm", "--op", args.op, "--backend", args.backend, "--min-bytes", str(args.min_bytes),
           "--max-bytes", str(args.max_bytes), "--step-factor", str(args.step_factor), "--dtype", args.dtype,
           "--iters", str(args.iters), "--warmup", str(args.warmup), "--repeats", str(args.repeats),
           "--timeout", str(args.timeout)]
    if args.no_check:
        out.append("--no-check")
    if args.uneven:
        out.append("--uneven")
    if args.stages:
        out.append("--stages")
    if args.baseline:
        out += ["--baseline", args.baseline]
    if args.json:
        out += ["--json", os.path.abspath(args.json)]
    return out


def _default_emulate(nproc):
    if nproc is None or nproc == 4:
        return DEFAULT_EMULATE
    if nproc < 2:
        from hal.bench.harness import BenchError
        raise BenchError(f"--nproc {nproc}: a collective benchmark needs at least 2 ranks")
    return f"cuda:{(nproc + 1) // 2},ascend:{nproc // 2}"


def check(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[int, dict]:
    """Every flag, chip variable and output path, before torchrun starts (hal.launch.check)."""
    from hal.launch.check import LaunchError, check_float, check_int, check_output_path, plan_ranks
    from hal.bench.harness import parse_size, size_ladder
    check_int("--iters", args.iters, 1, 100_000)
    check_int("--warmup", args.warmup, 0, 100_000)
    check_int("--repeats", args.repeats, 1, 1_000)
    check_float("--timeout", args.timeout, 0.0, 86_400.0)
    for flag, text in (("--min-bytes", args.min_bytes), ("--max-bytes", args.max_bytes)):
        try:
            parse_size(text)
        except ValueError as exc:
            raise LaunchError(f"{flag} {text}: {exc}") from None
    sizes = size_ladder(parse_size(args.min_bytes), parse_size(args.max_bytes), args.step_factor)
    if len(sizes) > 64:
        raise LaunchError(f"--step-factor {args.step_factor}: makes {len(sizes)} sizes from --min-bytes "
                          f"{args.min_bytes} to --max-bytes {args.max_bytes}; at most 64")
    args.json = check_output_path("--json", args.json, (".json",))
    nproc = args.nproc
    chip_only = envs.HAL_CHIP.is_set(environ) and not (envs.HAL_EMULATE.is_set(environ)
                                                       or envs.HAL_CLUSTER.is_set(environ))
    if nproc is None and (args.emulate == "none" or (args.emulate is None and chip_only)):
        nproc = 4  # no map to count: the help's default
    nproc, env, _, _ = plan_ranks(nproc, args.emulate, environ, _default_emulate, min_ranks=2)
    env.setdefault("OMP_NUM_THREADS", "1")
    return nproc, env


def launch(args: argparse.Namespace) -> int:
    """Re-run this command under torchrun on this machine; returns torchrun's exit code."""
    from hal.launch.check import run_ranks
    from hal.testing import free_port
    nproc, env = check(args, os.environ)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           "-m", "hal.cli.bench", *_argv(args)]
    print(f"# launching {nproc} ranks: HAL_EMULATE={env.get('HAL_EMULATE', '')} "
          f"{' '.join(shlex.quote(c) for c in cmd[1:])}", flush=True)
    return run_ranks("hal bench comm", cmd, env)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "bench", None) != "comm":
        print("usage: hal bench comm [options]  (see `hal bench comm --help`)", file=sys.stderr)
        return 2
    if args.uneven and args.op != "all_to_all":
        from hal.bench.harness import BenchError
        raise BenchError(f"--uneven applies to --op all_to_all only, got --op {args.op}")
    if args.stages and (args.backend != "hetero" or args.op != "all_reduce"):
        from hal.bench.harness import BenchError
        raise BenchError(f"--stages models the bridge's all_reduce: it needs --backend hetero --op all_reduce, "
                         f"got --backend {args.backend} --op {args.op}")
    if not _under_torchrun():
        return launch(args)
    return worker(args)


def worker(args: argparse.Namespace) -> int:
    """Every rank: control group, group under test, the measurement; rank 0 prints and writes JSON."""
    import torch
    import torch.distributed as dist

    import hal

    from hal.bench.comm import make_group, measure, stage_model
    from hal.bench.harness import HEADER, format_row, human_bytes, parse_size, size_ladder, summary

    timeout = datetime.timedelta(seconds=args.timeout)
    sizes = size_ladder(parse_size(args.min_bytes), parse_size(args.max_bytes), args.step_factor)
    acc = hal.accelerator()
    dist.init_process_group("gloo", timeout=timeout)  # control group: barriers and results only
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        chips: list = [None] * world
        dist.all_gather_object(chips, (acc.chip.name, acc.emulated))
        gut = make_group(args.backend, chips, timeout)
        if rank == 0:
            _print_preamble(args, chips, gut, sizes, human_bytes)
            print(HEADER, flush=True)
        show_group = len(gut.all_groups) > 1

        def on_row(rows):
            if rank == 0:
                for r in rows:
                    print(format_row(r, show_group), flush=True)

        def device_for(backend):
            return acc.device if backend in ("hetero", "vendor") else torch.device("cpu")

        opts = dict(iters=args.iters, warmup=args.warmup, repeats=args.repeats, check=not args.no_check,
                    uneven=args.uneven)
        base = make_group(args.baseline, chips, timeout) if args.baseline else None
        rows, base_rows = [], []
        for size in sizes:  # size by size, so the two backends see the same machine load
            rows += measure(args.op, [size], args.dtype, gut, device=device_for(args.backend), on_row=on_row,
                            **opts)
            if base is not None:
                base_rows += measure(args.op, [size], args.dtype, base, device=device_for(args.baseline), **opts)
        device = device_for(args.backend)
        s = summary(rows)
        s["wrong_total"] += sum(r.wrong for r in base_rows)
        if base is not None and rank == 0:
            _print_baseline(args, rows, base_rows)
        stages = None
        if args.stages:
            stages = stage_model(sizes, args.dtype, chips, timeout, args.iters, args.warmup, args.repeats, device)
            if rank == 0:
                _print_stages(stages, rows)
        if rank == 0:
            print(f"# Out of bounds values : {s['wrong_total']} {'OK' if s['wrong_total'] == 0 else 'FAILED'}")
            print(f"# Avg bus bandwidth    : {s['avg_busbw_GBps']:.3f} GB/s")
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(_report(args, chips, gut, rows, s, stages, base_rows), f, indent=2)
                print(f"# wrote {args.json}")
        dist.barrier()
        return 0 if s["wrong_total"] == 0 else 1
    finally:
        dist.destroy_process_group()


def _chips_text(chips: list) -> str:
    counts: dict = {}
    for chip, emulated in chips:
        key = f"{chip}{' (emulated)' if emulated else ''}"
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{k} x{v}" for k, v in counts.items())


def _print_preamble(args, chips, gut, sizes, human_bytes) -> None:
    import torch

    from hal.core.efficiency import busbw_factor
    n = len(gut.members)
    emulated = any(e for _, e in chips)
    print(f"# hal bench comm: {args.op}{' (uneven splits)' if args.uneven else ''} on backend {args.backend}, "
          f"{len(chips)} ranks: {_chips_text(chips)}")
    if emulated:
        from hal.emulation.emulate import cpu_ccl
        print(f"# EMULATED chips: every rank runs on this host's CPU; its vendor CCL is the CPU fabric "
              f"(HAL_CPU_CCL={cpu_ccl()}: auto = shared memory when a group is on one host, else gloo)")
    if len(gut.all_groups) > 1:
        print(f"# vendor CCL cannot span chips: one group per sub-cluster, measured concurrently: "
              f"{', '.join(f'{k} = ranks {v}' for k, v in gut.all_groups.items())}")
    print(f"# sizes {human_bytes(sizes[0])} .. {human_bytes(sizes[-1])} x{args.step_factor:g}, dtype {args.dtype}, "
          f"{args.warmup} warmup, median of {args.repeats} repeats x {args.iters} iters (slowest rank per repeat); "
          f"busbw factor {busbw_factor(args.op, n):.3f} for n={n}; torch {torch.__version__}")


def _print_stages(stages, rows) -> None:
    if stages is None:
        print("# stage model: needs several sub-clusters of one size (equal rails); not modelled")
        return
    print("# the bridge against its own model: its all_reduce stages timed one by one on groups shaped like its "
          "own (every sub-cluster's vendor group / every rail at once; median of repeats, slowest group).")
    print("# path rail: intra reduce-scatter S | rail all_reduce S/n | intra all_gather S;  path leader (S <= "
          "HAL_BRIDGE_SMALL_BYTES): intra reduce | leader-rail all_reduce | intra broadcast, each of S")
    print("# sum = stages back to back (no overlap); max = the slowest stage alone (perfect chunk pipelining)")
    print("#{:>12} {:>7} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>8} {:>8}".format(
        "size", "path", "intra(us)", "cross(us)", "intra(us)", "sum(us)", "max(us)", "hetero(us)", "het/sum",
        "het/max"))
    for st, row in zip(stages, rows):
        st.measured_us = row.time_us
        print(" {:>12} {:>7} {:>11.1f} {:>11.1f} {:>11.1f} {:>11.1f} {:>11.1f} {:>11.1f} {:>8.2f} {:>8.2f}".format(
            st.size_bytes, st.path, st.intra_in_us, st.cross_us, st.intra_out_us, st.sum_us, st.max_us,
            row.time_us, row.time_us / st.sum_us, row.time_us / st.max_us), flush=True)


def _print_baseline(args, rows, base_rows) -> None:
    from hal.bench.harness import comparison_lines
    print(f"# {args.baseline} measured in the same job, size by size; speedup = {args.baseline} time / "
          f"{args.backend} time (> 1: {args.backend} is faster; a backend with one group per sub-cluster "
          f"counts its slowest group)")
    for line in comparison_lines(rows, base_rows, args.backend, args.baseline):
        print(line)


def _report(args, chips, gut, rows, s, stages=None, base_rows=()) -> dict:
    import torch
    return {"tool": "hal bench comm", "op": args.op, "uneven": args.uneven, "backend": args.backend,
            "dtype": args.dtype,
            "world_size": len(chips), "chips": [{"rank": r, "chip": c, "emulated": e}
                                               for r, (c, e) in enumerate(chips)],
            "emulated": any(e for _, e in chips), "groups": gut.all_groups,
            "cpu_fabric": envs.HAL_CPU_CCL.get(),
            "iters": args.iters, "warmup": args.warmup, "repeats": args.repeats,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "host": socket.gethostname(), "cpu_count": os.cpu_count(),
            "rows": [r.as_dict() for r in rows], "summary": s,
            "stages": [st.as_dict() for st in stages] if stages else None,
            "baseline": args.baseline, "baseline_rows": [r.as_dict() for r in base_rows]}


def main(argv: Optional[list[str]] = None) -> int:
    from hal.bench.harness import BenchError
    from hal.contract.errors import HalError
    p = argparse.ArgumentParser(prog="python -m hal.cli.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return run(args)
    except Exception as exc:
        if _under_torchrun():  # one marked line for the launcher, which prints the first rank's once
            from hal.launch.check import report_rank_failure
            report_rank_failure(exc)
        if not isinstance(exc, (BenchError, HalError)):
            raise
        print(f"hal bench: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
