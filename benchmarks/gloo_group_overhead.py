"""What the HAL's gloo group (hal.emulation.gloo_group.StridedSafeGloo) costs per call over torch's ProcessGroupGloo.

    python benchmarks/gloo_group_overhead.py [--repeats 7] [--calls 2000]

One process, world size 1 (a HashStore), so the figure is the Python cost the wrapper adds (the
typed-refusal lookup, the contiguity test, the Python override) without network time; contiguous
calls go straight to gloo. Also times a strided all_reduce (a column view), which is staged through
a contiguous copy, against the same call on a contiguous tensor of the same size. Prints medians
over `--repeats` runs of `--calls` calls, and the ratios.
"""
from __future__ import annotations

import argparse
from datetime import timedelta

import torch
import torch.distributed as dist

from hal.bench.harness import median_us as _median_us
from hal.emulation.gloo_group import StridedSafeGloo


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args(argv)
    timeout = timedelta(seconds=30)
    raw = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timeout)
    safe = StridedSafeGloo(dist.HashStore(), 0, 1, timeout)
    opts = dist.AllreduceOptions()
    print(f"torch {torch.__version__}, world size 1, median of {args.repeats} x {args.calls} calls")
    for numel in (256, 65536):
        t = torch.ones(numel)
        r = _median_us(lambda: raw.allreduce([t], opts).wait(), args.calls, args.repeats)
        s = _median_us(lambda: safe.allreduce([t], opts).wait(), args.calls, args.repeats)
        print(f"all_reduce {numel * 4:>7} B contiguous: ProcessGroupGloo {r:8.1f} us, StridedSafeGloo {s:8.1f} us "
              f"(+{s - r:.1f} us, x{s / r:.2f})")
        base = torch.ones(numel, 2)
        col = base[:, 0]  # numel elements, stride 2: staged through a contiguous copy
        c = _median_us(lambda: safe.allreduce([col], opts).wait(), args.calls, args.repeats)
        print(f"all_reduce {numel * 4:>7} B strided:    StridedSafeGloo {c:8.1f} us (x{c / s:.2f} the contiguous call; "
              f"torch's gloo gives a wrong result here)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
