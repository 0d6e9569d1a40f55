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
  hal bench comm --model --baseline gloo --max-bytes 64M   # each time next to the link model
  hal bench comm --model --nic-rate 200Mb/s --intra-rate inf ...   # the model at a test bed's line rate
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
    from hal.bench import BACKENDS, DTYPES, OPS  # torch-free: --help loads no torch
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
    c.add_argument("--model", action="store_true",
                   help="also print each size's link-bound model (hal.core.link_model: the backend's and "
                        "the baseline's algorithm, payload only, at link rate on this job's ranks and nodes) "
                        "and the measured time's share of it; all_reduce and all_to_all on hetero and gloo")
    c.add_argument("--nic-rate", default=None, metavar="RATE",
                   help="--model: every rank's NIC rate per direction, e.g. 200Mb/s or 25MB/s (default: each "
                        "chip's catalog nic_bandwidth)")
    c.add_argument("--intra-rate", default=None, metavar="RATE",
                   help="--model: the intra-node fabric's rate per direction, 'inf' for unbounded (default: "
                        "each chip's catalog intra_node_bandwidth)")
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
    if args.model:
        out.append("--model")
        for flag, v in (("--nic-rate", args.nic_rate), ("--intra-rate", args.intra_rate)):
            if v is not None:
                out += [flag, str(v)]
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
    _rates(args)  # --nic-rate / --intra-rate checked before anything starts
    if not _under_torchrun():
        return launch(args)
    return worker(args)


def worker(args: argparse.Namespace) -> int:
    """Every rank: control group, group under test, the measurement; rank 0 prints and writes JSON."""
    import torch
    import torch.distributed as dist

    import hal

    from hal.bench.comm import make_group, measure
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
        s = summary(rows)
        s["wrong_total"] += sum(r.wrong for r in base_rows)
        if base is not None and rank == 0:
            _print_baseline(args, rows, base_rows)
        model = _link_model(args, chips, rows, base_rows) if args.model else None
        if rank == 0:
            print(f"# Out of bounds values : {s['wrong_total']} {'OK' if s['wrong_total'] == 0 else 'FAILED'}")
            print(f"# Avg bus bandwidth    : {s['avg_busbw_GBps']:.3f} GB/s")
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(_report(args, chips, gut, rows, s, model, base_rows), f, indent=2)
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


def _rates(args) -> tuple:
    """(NIC, intra) bytes/s from --nic-rate / --intra-rate (None: the catalog's); LaunchError if malformed."""
    from hal.launch.check import LaunchError
    from hal.testbed.spec import parse_rate
    out: list[Optional[float]] = []
    for flag, text in (("--nic-rate", args.nic_rate), ("--intra-rate", args.intra_rate)):
        if text is None:
            out.append(None)
        elif flag == "--intra-rate" and str(text).strip().lower() in ("inf", "unbounded"):
            out.append(float("inf"))
        else:
            try:
                out.append(float(parse_rate(text) or 0.0) / 8)
            except Exception as exc:  # TestbedSpecError: its message names the value
                raise LaunchError(f"{flag} {text}: {exc}") from None
    return tuple(out)


def _link_model(args, chips, rows, base_rows) -> Optional[dict]:
    """Every rank's node gathered (collective); rank 0 prints each size against hal.core.link_model."""
    import torch.distributed as dist

    from hal.bench.comm import link_topology, model_rows
    nodes: list = [None] * len(chips)
    dist.all_gather_object(nodes, int(os.environ.get("GROUP_RANK", "0")))
    nic, intra = _rates(args)
    topo = link_topology(chips, nodes, nic, intra)
    by_size = lambda rs: {r.size_bytes: r for r in sorted(rs, key=lambda r: r.time_us)}  # noqa: E731 - slowest group
    mrows = model_rows(args.op, args.backend, args.baseline, sorted(by_size(rows).values(), key=lambda r: r.size_bytes),
                       topo, args.uneven)
    if dist.get_rank() == 0:
        _print_model(args, topo, mrows, by_size(rows), by_size(base_rows))
    return {"topology": topo.describe(), "rows": [m.as_dict() for m in mrows] if mrows else None}


def _print_model(args, topo, mrows, rows, base_rows) -> None:
    links = "; ".join(f"{sc.name} ranks {sc.ranks} on node(s) {sc.node_ids}: NIC {sc.nic_bandwidth.bytes_per_s:.4g} "
                      f"B/s ({sc.nic_bandwidth.source}), intra {sc.intra_bandwidth.bytes_per_s:.4g} B/s"
                      for sc in topo.sub_clusters)
    if mrows is None:
        print(f"# link model: none for --op {args.op} on --backend {args.backend}"
              f"{f' / {args.baseline}' if args.baseline else ''} (hal.core.link_model: all_reduce and all_to_all "
              f"on hetero and gloo)")
        return
    print(f"# link model (hal.core.link_model: payload only, at link rate, the busiest NIC or fabric direction; a "
          f"lower bound on time): {links}")
    print("#{:>12} {:>12} {:>12} {:>8} {:>14} {:>12} {:>8}".format(
        "size", "model(us)", f"{args.backend}(us)", "of model", "base model(us)", "base(us)", "of model"))
    pct = lambda m, t: f"{100 * m / t:.0f}%" if m is not None and t else "-"  # noqa: E731
    for m in mrows:
        r, b = rows.get(m.size_bytes), base_rows.get(m.size_bytes)
        print(" {:>12} {:>12} {:>12.1f} {:>8} {:>14} {:>12} {:>8}".format(
            m.size_bytes, "-" if m.model_us is None else f"{m.model_us:.1f}", r.time_us, pct(m.model_us, r.time_us),
            "-" if m.baseline_model_us is None else f"{m.baseline_model_us:.1f}",
            "-" if b is None else f"{b.time_us:.1f}", pct(m.baseline_model_us, b.time_us if b else None)), flush=True)


def _print_baseline(args, rows, base_rows) -> None:
    from hal.bench.harness import comparison_lines
    print(f"# {args.baseline} measured in the same job, size by size; speedup = {args.baseline} time / "
          f"{args.backend} time (> 1: {args.backend} is faster; a backend with one group per sub-cluster "
          f"counts its slowest group)")
    for line in comparison_lines(rows, base_rows, args.backend, args.baseline):
        print(line)


def _report(args, chips, gut, rows, s, model=None, base_rows=()) -> dict:
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
            "link_model": model,
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
