"""The one benchmark harness: message sizes, timing (median over repeats of the slowest rank), the
nccl-tests bandwidth figures, the nccl-tests style table and candidate/baseline comparisons.

`hal bench comm` (hal/cli/bench.py over hal/bench/comm.py) and the scripts in benchmarks/ use it;
nothing here imports torch, so a script's own argument errors cost no torch start-up. The bus
bandwidth factors are hal's (`hal.core.efficiency.busbw_factor`), shared with the conformance perf level.

Conventions (nccl-tests, doc/PERFORMANCE.md):
* size is the total message in bytes: the buffer of all_reduce / broadcast / reduce, the gathered
  output of all_gather, the input of reduce_scatter, the send buffer of all_to_all;
* algbw = size / time; busbw = algbw x busbw_factor(op, n);
* a repeat lasts as long as its slowest rank; a figure is the median over repeats.
"""
from __future__ import annotations

import math
import re
import statistics
import timeit
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Sequence

from hal.core.efficiency import busbw_factor
from hal.contract.errors import HalError

__all__ = ["BenchError", "Row", "HEADER", "bandwidths", "busbw_factor", "comparison_lines", "format_row",
           "human_bytes", "median_us", "parse_size", "size_ladder", "slowest_median", "summary"]


class BenchError(HalError, ValueError):
    """A benchmark request that cannot run as given; the message names the option and value."""


# ---- sizes ------------------------------------------------------------------------------------------

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgKMG]?)(i?[bB]?)\s*$")


def parse_size(text: str) -> int:
    """'4K' -> 4096, '256M' -> 268435456, '1G', '64MiB', '1024' (binary multiples, as nccl-tests)."""
    m = _SIZE.match(str(text))
    if not m:
        raise BenchError(f"size {text!r} is not a byte count like 4096, 4K, 64M or 1G")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


def size_ladder(min_bytes: int, max_bytes: int, factor: float = 2.0) -> list[int]:
    """min, min*factor, ... up to max (inclusive)."""
    if min_bytes < 1 or max_bytes < min_bytes:
        raise BenchError(f"sizes: need 1 <= --min-bytes ({min_bytes}) <= --max-bytes ({max_bytes})")
    if factor <= 1.0:
        raise BenchError(f"--step-factor must be > 1, got {factor}")
    sizes, s = [], float(min_bytes)
    while s <= max_bytes * (1 + 1e-9):
        sizes.append(int(s))
        s *= factor
    return sizes


def human_bytes(n: int) -> str:
    """'64 MiB' for an exact binary multiple, else '<n> B'."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


# ---- timing -----------------------------------------------------------------------------------------

def slowest_median(per_rank: Sequence[Sequence[float]]) -> tuple[float, list[float]]:
    """(median, per-repeat times) where a repeat's time is its slowest rank's: `per_rank[r][i]` is
    rank r's time of repeat i (every rank ran the same repeats, between barriers)."""
    if not per_rank or not per_rank[0]:
        raise BenchError("slowest_median: no timings (no ranks or no repeats)")
    repeats = len(per_rank[0])
    if any(len(t) != repeats for t in per_rank):
        raise BenchError(f"slowest_median: ranks timed different repeat counts {[len(t) for t in per_rank]}")
    slowest = [max(t[i] for t in per_rank) for i in range(repeats)]
    return statistics.median(slowest), slowest


def median_us(fn: Callable[[], object], calls: int, repeats: int, warmup: int = 200) -> float:
    """One process: median over `repeats` of the mean time per call of `calls` back-to-back calls, in
    microseconds, after `min(warmup, calls)` untimed calls."""
    for _ in range(min(warmup, calls)):
        fn()
    return statistics.median(timeit.timeit(fn, number=calls) / calls * 1e6 for _ in range(repeats))


def bandwidths(op: str, nbytes: int, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for `op` moving `nbytes` (nccl-tests size) on `n` ranks in `seconds`."""
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * busbw_factor(op, n)


# ---- the table ----------------------------------------------------------------------------------------

@dataclass
class Row:
    """One line of the table; `repeats_us` keeps every repeat's time behind the median."""

    op: str
    size_bytes: int
    count: int
    dtype: str
    redop: str
    root: int
    time_us: float
    algbw_GBps: float
    busbw_GBps: float
    wrong: int
    repeats_us: list = field(default_factory=list)
    group: str = "world"

    def as_dict(self) -> dict:
        return asdict(self)


HEADER = ("#{:>12} {:>12} {:>9} {:>6} {:>5} {:>11} {:>8} {:>8} {:>7}".format(
    "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong") + "\n" +
    "#{:>12} {:>12} {:>9} {:>6} {:>5} {:>11} {:>8} {:>8} {:>7}".format(
    "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", ""))


def format_row(row: Row, show_group: bool = False) -> str:
    line = " {:>12} {:>12} {:>9} {:>6} {:>5} {:>11.1f} {:>8.3f} {:>8.3f} {:>7}".format(
        row.size_bytes, row.count, row.dtype, row.redop, row.root, row.time_us, row.algbw_GBps,
        row.busbw_GBps, row.wrong)
    return line + (f"  {row.group}" if show_group else "")


def summary(rows: Iterable[Row]) -> dict:
    """Out-of-bounds count and the average busbw, as nccl-tests prints at the end."""
    rows = list(rows)
    bus = [r.busbw_GBps for r in rows]
    return {"wrong_total": sum(r.wrong for r in rows),
            "avg_busbw_GBps": sum(bus) / len(bus) if bus else math.nan}


def comparison_lines(rows: Iterable[Row], base_rows: Iterable[Row], candidate: str, baseline: str,
                     label: str = "") -> list[str]:
    """Size by size: both busbw figures, both times and speedup = baseline time / candidate time
    (> 1: the candidate is faster). Where a backend has one row per group at a size (vendor groups on
    a mixed cluster), the slowest group counts."""
    def by_size(rs):
        out: dict = {}
        for r in rs:
            if r.size_bytes not in out or r.time_us > out[r.size_bytes].time_us:
                out[r.size_bytes] = r
        return out

    cand, base = by_size(rows), by_size(base_rows)
    lines = ["#{:>12} {:>14} {:>14} {:>14} {:>14} {:>8} {:>7}".format(
        "size", f"{candidate} busbw", f"{baseline} busbw", f"{candidate}(us)", f"{baseline}(us)", "speedup",
        "#wrong")]
    for size in sorted(cand):
        c, b = cand[size], base.get(size)
        if b is None:
            continue
        lines.append(" {:>12} {:>9.3f}GB/s {:>9.3f}GB/s {:>14.1f} {:>14.1f} {:>7.2f}x {:>7}{}".format(
            size, c.busbw_GBps, b.busbw_GBps, c.time_us, b.time_us, b.time_us / c.time_us, c.wrong + b.wrong,
            f"  {label}" if label else ""))
    return lines
