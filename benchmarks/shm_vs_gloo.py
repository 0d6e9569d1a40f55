"""Shared-memory fabric vs gloo: bus bandwidth per size, all_reduce and all_gather, 2 and 4 ranks.

    .venv/bin/python benchmarks/shm_vs_gloo.py [--ranks 2,4] [--repeats 5] [--json out.json]

Both backends run in the same processes and alternate within every repeat (one run, same noise);
figures are medians over repeats of the slowest rank, busbw by the nccl-tests formulas. The last
lines compare with the issue's targets for 2 ranks: all_reduce busbw >= 2x gloo at 16-64 MiB and
>= 20x faster at 4 KiB. A benchmark, not a test: it prints figures and never fails on them.
The measuring code is `hal.shm.bench` (also used by `hal bench comm`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from hal.shm.bench import OPS, SIZES, format_table, measure, speedup


def _sizes(text: str) -> list:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    out = []
    for item in text.split(","):
        item = item.strip().lower().removesuffix("ib").removesuffix("b")
        out.append(int(float(item[:-1]) * units[item[-1]]) if item[-1] in units else int(item))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,4", help="world sizes, comma-separated (default 2,4)")
    ap.add_argument("--ops", default=",".join(OPS), help=f"collectives (default {','.join(OPS)})")
    ap.add_argument("--sizes", default=None, help="bytes, e.g. 4K,1M,64M (default 4 KiB .. 64 MiB, x4 steps)")
    ap.add_argument("--repeats", type=int, default=5, help="repeats per size (median reported)")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args(argv)
    ranks = [int(r) for r in args.ranks.split(",")]
    sizes = _sizes(args.sizes) if args.sizes else list(SIZES)
    load = os.getloadavg()
    print(f"# shm vs gloo, ranks {ranks}, {args.repeats} repeats, {os.cpu_count()} CPUs, "
          f"load average {load[0]:.1f} at start (other work on the machine skews both alike)")
    rows = measure(world_sizes=ranks, ops=args.ops.split(","), sizes=sizes, repeats=args.repeats)
    print(format_table(rows))
    if 2 in ranks and "all_reduce" in args.ops:
        small = speedup(rows, 2, "all_reduce", 4096)
        big = [(s, speedup(rows, 2, "all_reduce", s)) for s in (16 << 20, 32 << 20, 64 << 20) if s in sizes]
        if small is not None:
            print(f"2 ranks all_reduce 4 KiB: shm {small:.1f}x faster than gloo (target >= 20x)")
        for s, r in big:
            print(f"2 ranks all_reduce {s >> 20} MiB: shm busbw {r:.1f}x gloo's (target >= 2x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
