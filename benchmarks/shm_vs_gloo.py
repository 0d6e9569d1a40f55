"""Shared-memory fabric vs gloo: bus bandwidth per size, all_reduce and all_gather, 2 and 4 ranks.

    .venv/bin/python -m benchmarks.shm_vs_gloo [--ranks 2,4] [--repeats 5] [--sizes 4K,1M,64M] [--json out.json]

The measurement is `hal bench comm`'s (hal/bench/comm.py on hal/bench/harness.py): in one
hal.testing.WorkerPool per world size, every rank builds an shm group and a gloo group and, size by
size, measures shm then gloo on the same processes (one run, so machine noise hits both alike);
figures are medians over repeats of the slowest rank, busbw by the nccl-tests factors, #wrong from a
checked run. The last lines compare with the shm issue's targets for 2 ranks: all_reduce busbw >= 2x
gloo at 16-64 MiB and >= 20x faster at 4 KiB. A benchmark, not a test: it prints figures and never
fails on them. (Before the harness was shared, this script alternated the two backends within every
repeat; the figures in docs/performance.md up to issue 15 were taken that way.)
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from hal.bench.harness import Row, comparison_lines, parse_size

SIZES = tuple(4096 * 4 ** k for k in range(8))  # 4 KiB .. 64 MiB
OPS = ("all_reduce", "all_gather")


def _iters(nbytes: int) -> int:
    """Enough operations per repeat that one repeat is not just timer noise, few enough for 64 MiB."""
    return max(2, min(100, (8 << 20) // max(1, nbytes)))


def _rank_main(ops: list, sizes: list, repeats: int, timeout_s: float) -> dict:
    """Every rank (WorkerPool): {backend: [row dicts]} for every op and size, shm and gloo in turn."""
    from datetime import timedelta

    import torch.distributed as dist

    from hal.bench.comm import make_group, measure

    timeout = timedelta(seconds=timeout_s)
    dist.init_process_group("gloo", timeout=timeout)  # the control group (barriers, gathering results)
    try:
        chips = [("cpu", False)] * dist.get_world_size()
        groups = {b: make_group(b, chips, timeout) for b in ("shm", "gloo")}
        out: dict = {b: [] for b in groups}
        for op in ops:
            for nbytes in sizes:
                for backend, gut in groups.items():
                    rows = measure(op, [nbytes], "float32", gut, iters=_iters(nbytes), warmup=1, repeats=repeats)
                    out[backend] += [r.as_dict() for r in rows]
        dist.barrier()
        return out
    finally:
        dist.destroy_process_group()


def measure_both(world_sizes, ops, sizes, repeats: int, timeout_s: float = 300.0) -> dict:
    """{world size: {backend: [Row]}} (rank 0's copy: every rank gathers every rank's timings)."""
    from hal.testing import WorkerPool

    result = {}
    for n in world_sizes:
        with WorkerPool(n, env={"OMP_NUM_THREADS": "1"}) as pool:
            per_rank = pool.run(_rank_main, list(ops), list(sizes), repeats, timeout_s, timeout=timeout_s * 4)
        result[n] = {b: [Row(**r) for r in rows] for b, rows in per_rank[0].items()}
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,4", help="world sizes, comma-separated (default 2,4)")
    ap.add_argument("--ops", default=",".join(OPS), help=f"collectives (default {','.join(OPS)})")
    ap.add_argument("--sizes", default=None, help="bytes, e.g. 4K,1M,64M (default 4 KiB .. 64 MiB, x4 steps)")
    ap.add_argument("--repeats", type=int, default=5, help="repeats per size (median reported)")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args(argv)
    ranks = [int(r) for r in args.ranks.split(",")]
    sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else list(SIZES)
    ops = args.ops.split(",")
    load = os.getloadavg()
    print(f"# shm vs gloo, ranks {ranks}, {args.repeats} repeats, {os.cpu_count()} CPUs, "
          f"load average {load[0]:.1f} at start (other work on the machine skews both alike)")
    result = measure_both(ranks, ops, sizes, args.repeats)
    print("# speedup = gloo time / shm time (> 1: shm is faster)")
    for n, rows in result.items():
        for op in ops:
            lines = comparison_lines([r for r in rows["shm"] if r.op == op], [r for r in rows["gloo"] if r.op == op],
                                     "shm", "gloo", label=f"{n} ranks {op}")
            print("\n".join(lines if (n, op) == (ranks[0], ops[0]) else lines[1:]))
    if 2 in result and "all_reduce" in ops:
        def cell(backend, nbytes):
            return next((r for r in result[2][backend] if r.op == "all_reduce" and r.size_bytes == nbytes), None)
        small = (cell("shm", 4096), cell("gloo", 4096))
        if all(small):
            print(f"2 ranks all_reduce 4 KiB: shm {small[1].time_us / small[0].time_us:.1f}x faster than gloo "
                  f"(target >= 20x)")
        for s in (16 << 20, 32 << 20, 64 << 20):
            c, b = cell("shm", s), cell("gloo", s)
            if c and b:
                print(f"2 ranks all_reduce {s >> 20} MiB: shm busbw {c.busbw_GBps / b.busbw_GBps:.1f}x gloo's "
                      f"(target >= 2x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({n: {b: [r.as_dict() for r in rs] for b, rs in rows.items()} for n, rows in result.items()},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
