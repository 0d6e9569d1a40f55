"""Level `perf`: measure the chip (matmul FLOP/s, memory bandwidth, collective busbw) into its
efficiency matrix. Never a verdict on speed: a perf check fails only if its measurement could not
run or gave a figure that is not a positive finite number.

`perf.profile_agreement` is the one verdict: figures the chip's profile declares must agree with
what this level measures (a declared figure far from reality misleads every planner).

Figures are medians of repeats (each timed between device synchronizations). Sizes depend on the
device: on a host (the cpu chip, every emulated chip) they are small enough to finish in seconds on
a shared CI machine; on an accelerator they are large enough to reach its steady state.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

from ..checks import Check, CheckFailed, CheckNotApplicable, CheckSkipped, Passed, Where


def _host(ctx) -> bool:
    return ctx.acc.runtime.device_type == "cpu"


def _time(fn: Callable[[], None], sync: Callable[[], None], repeats: int, budget_s: float) -> tuple[float, int]:
    """(median seconds, repeats done) of fn() after one warm-up, stopping early past `budget_s`."""
    fn()
    sync()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeats:
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s:
            break
    return statistics.median(times), len(times)


def check_matmul(ctx) -> Passed:
    import torch
    acc = ctx.acc
    host = _host(ctx)
    shapes = {"float32": (256, 512, 1024), "bfloat16": (128, 256), "float16": (128, 256)} if host else \
        {d: (1024, 4096, 8192) for d in ("float32", "bfloat16", "float16")}
    figures, lines = [], []
    for dname, sizes in shapes.items():
        dt = getattr(torch, dname)
        if dt not in acc.supported_dtypes():
            continue
        peak = None if acc.emulated else acc.profile.peak(dname)
        for s in sizes:
            a = torch.randn(s, s, device=acc.device).to(dt)
            b = torch.randn(s, s, device=acc.device).to(dt)
            sec, reps = _time(lambda: torch.matmul(a, b), acc.synchronize, 5, 1.0 if host else 5.0)
            flops = 2.0 * s ** 3 / sec
            figures.append({"dtype": dname, "m": s, "n": s, "k": s, "flops_per_s": flops, "seconds_median": sec,
                            "repeats": reps, "fraction_of_peak": (flops / peak) if peak else None})
            lines.append(f"{dname} {s}^3: {flops / 1e9:.3g} GFLOP/s")
    if not figures:
        raise CheckSkipped("the device supports none of float32, bfloat16, float16")
    _finite(figures, "flops_per_s")
    data: dict = {"matmul": figures, "meta": _meta(ctx)}
    if not host and not acc.emulated:
        kept = sustained_matmul(acc, [f["dtype"] for f in figures])
        data["sustained_matmul"] = kept
        lines.append(f"sustained {kept['sustained']:.3f} of the short-run rate")
    return Passed("; ".join(lines), data)


SUSTAIN_S = 20.0     # long enough for a power cap to engage (an H100 at 700 W: within a few seconds)


def sustained_matmul(acc, dtypes: list, size: int = 8192, duration_s: float = SUSTAIN_S) -> dict:
    """The rate a chip keeps under back-to-back matmuls (the efficiency matrix's `sustained_matmul`, which
    replaces the catalog's `sustained` share): rounds of 10 size^3 matmuls in bfloat16 (else float16, else
    float32) for `duration_s`; the fastest of the first 3 rounds against the median of the second half."""
    import torch
    dname = next((d for d in ("bfloat16", "float16", "float32") if d in dtypes), dtypes[0])
    dt = getattr(torch, dname)
    a = torch.randn(size, size, device=acc.device).to(dt)
    b = torch.randn(size, size, device=acc.device).to(dt)
    torch.matmul(a, b)
    acc.synchronize()
    times: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < duration_s or len(times) < 6:
        t0 = time.perf_counter()
        for _ in range(10):
            torch.matmul(a, b)
        acc.synchronize()
        times.append(time.perf_counter() - t0)
    short, kept = min(times[:3]), statistics.median(times[len(times) // 2:])
    return {"dtype": dname, "m": size, "duration_s": time.perf_counter() - start, "rounds": len(times),
            "seconds_short": short, "seconds_sustained": kept, "sustained": min(1.0, short / kept)}


def check_memory_bandwidth(ctx) -> Passed:
    import torch
    acc = ctx.acc
    nbytes = (64 if _host(ctx) else 1024) * 2 ** 20
    src = torch.ones(nbytes // 4, device=acc.device)
    dst = torch.empty_like(src)
    sec, reps = _time(lambda: dst.copy_(src), acc.synchronize, 5, 2.0 if _host(ctx) else 5.0)
    bw = 2.0 * nbytes / sec
    peak = None if acc.emulated else acc.profile.memory_bandwidth.value
    fig = {"kind": "device_copy", "bytes": nbytes, "bytes_per_s": bw, "seconds_median": sec, "repeats": reps,
           "fraction_of_peak": (bw / peak) if peak else None}
    _finite([fig], "bytes_per_s")
    return Passed(f"copy of {nbytes >> 20} MiB: {bw / 1e9:.3g} GB/s (read + write)",
                  {"memory_bandwidth": [fig], "meta": _meta(ctx)})


def check_collective_busbw(ctx) -> Passed:
    import torch
    import torch.distributed as dist

    from hal.core.efficiency import BUSBW_FACTOR
    acc, pg, n, rank = ctx.acc, ctx.ccl(), ctx.world_size, ctx.rank
    host = _host(ctx)
    sizes = [1 << p for p in (range(12, 23, 2) if host else range(16, 29, 2))]
    figures, lines = [], []
    for coll in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"):
        for nbytes in sizes:
            elems = max(nbytes // 4 // n * n, n)  # a multiple of n float32 elements
            x = torch.ones(elems, device=acc.device)
            if coll == "all_reduce":
                fn = lambda: pg.allreduce([x], dist.AllreduceOptions()).wait()  # noqa: E731
            elif coll == "all_gather":  # nccl-tests size: the gathered total
                part = x[: elems // n]
                fn = lambda: pg._allgather_base(x, part).wait()  # noqa: E731
            elif coll == "reduce_scatter":
                out = torch.empty(elems // n, device=acc.device)
                fn = lambda: pg._reduce_scatter_base(out, x, dist.ReduceScatterOptions()).wait()  # noqa: E731
            elif coll == "all_to_all":
                out = torch.empty_like(x)
                fn = lambda: pg.alltoall_base(out, x, [], [], dist.AllToAllOptions()).wait()  # noqa: E731
            else:
                fn = lambda: pg.broadcast([x], dist.BroadcastOptions()).wait()  # noqa: E731
            # A fixed number of repeats (no time budget): every rank must call the collective the
            # same number of times. The figure is the slowest rank's median.
            sec, reps = _time(fn, acc.synchronize, 5, float("inf"))
            sec = ctx.agree_max([sec])[0]
            size = elems * 4
            algbw = size / sec
            figures.append({"collective": coll, "dtype": "float32", "bytes": size, "world_size": n,
                            "seconds_median": sec, "algbw": algbw, "busbw": algbw * BUSBW_FACTOR[coll](n),
                            "repeats": reps})
        best = max(f["busbw"] for f in figures if f["collective"] == coll)
        lines.append(f"{coll} best busbw {best / 1e9:.3g} GB/s")
    _finite(figures, "busbw")
    data = {"collectives": figures, "ccl": type(pg).__name__} if rank == 0 else None
    return Passed(f"{n} ranks, {len(sizes)} sizes {sizes[0]}..{sizes[-1]} B: " + "; ".join(lines), data)


def _finite(figures: list[dict], key: str) -> None:
    import math
    bad = [f for f in figures if not (isinstance(f[key], float) and math.isfinite(f[key]) and f[key] > 0)]
    if bad:
        raise CheckFailed(f"the measurement gave non-positive or non-finite {key}: {bad[:3]}")


def _meta(ctx) -> dict:
    import torch
    acc = ctx.acc
    return {"chip": acc.chip.name, "profile_model": acc.profile.model, "emulated": acc.emulated,
            "device": str(acc.device), "torch_version": torch.__version__}


def check_efficiency_matrix(ctx) -> Passed:
    """Assemble the figures measured so far into the efficiency matrix and validate it."""
    from .perf_matrix import assemble
    matrix = assemble(ctx)
    return Passed(f"efficiency matrix {matrix.schema_version}: {len(matrix.matmul)} matmul, "
                  f"{len(matrix.memory_bandwidth)} bandwidth, {len(matrix.collectives)} collective figures; "
                  f"validates against hal.core.efficiency.EfficiencyMatrix", matrix)


AGREEMENT = (0.01, 1.25)  # measured / declared: below 1 % or above 125 % the declared figure is wrong
# Collective bus bandwidth within one node against the declared per-direction intra-node link: a
# busbw above twice the link is impossible (in-switch reduction, NVLS/SHARP, reaches about 1.1x), so
# the figure is too low or in another unit; under 1 % the figure belongs to another interconnect.
BUSBW_AGREEMENT = (0.01, 2.0)


def _data(ctx, cid: str) -> dict:
    """The figures a perf check measured in this run ({} if it did not pass); rank 0's for an `all` check."""
    r = ctx.results.get(cid)
    if r is None or r.status != "passed" or not r.data:
        return {}
    data = r.data
    if isinstance(data, list):
        data = next((d for d in data if d), None) or {}
    return data


def _agreement_pairs(ctx, prof) -> list[tuple[str, float, float, str, tuple[float, float]]]:
    """(figure, measured, declared, unit, allowed measured/declared) for every declared figure measured."""
    pairs = []
    best: dict[str, float] = {}
    for f in _data(ctx, "perf.matmul").get("matmul", []):
        best[f["dtype"]] = max(best.get(f["dtype"], 0.0), f["flops_per_s"])
    for dtype, measured in best.items():
        fig = prof.peak_flops.get(dtype)
        if fig is not None and fig.known:
            pairs.append((f"peak_flops[{dtype}]", measured, fig.value, "FLOP/s", AGREEMENT))
    bw = _data(ctx, "perf.memory_bandwidth").get("memory_bandwidth", [])
    if bw and prof.memory_bandwidth.known:
        pairs.append(("memory_bandwidth", bw[0]["bytes_per_s"], prof.memory_bandwidth.value, "B/s", AGREEMENT))
    busbw = [f["busbw"] for f in _data(ctx, "perf.collective_busbw").get("collectives", [])]
    if busbw and prof.intra_node_bandwidth.known:
        pairs.append(("intra_node_bandwidth (best collective busbw)", max(busbw), prof.intra_node_bandwidth.value,
                      "B/s", BUSBW_AGREEMENT))
    return pairs


def check_profile_agreement(ctx) -> str:
    """Every figure the profile declares that the perf level measured must be near it: a chip never
    beats its peak (measured > 1.25 x declared: the figure is too low, or in another unit), and a
    matmul of 1024..8192 or a 1 GiB copy reaches far more than 1 % of a true peak (below: the figure
    belongs to another chip or unit); the best collective busbw within a node lies within
    BUSBW_AGREEMENT of the declared intra-node link. Planners divide work by these figures. Native
    runs only: an emulated chip's figures measure the host CPU."""
    t = ctx.target
    if t.emulated:
        raise CheckNotApplicable("emulated: the perf figures measure the host CPU, not the chip its profile "
                                 "describes; contract.profile_plausible checks the declared figures' ranges")
    if not any(_data(ctx, cid) for cid in ("perf.matmul", "perf.memory_bandwidth", "perf.collective_busbw")):
        raise CheckSkipped("perf.matmul, perf.memory_bandwidth and perf.collective_busbw did not run or measured "
                           "nothing in this run")
    prof = t.pm.profile(t.chip, None)
    pairs = _agreement_pairs(ctx, prof)
    if not pairs:
        raise CheckNotApplicable(f"profile {prof.model!r} declares none of the measured figures (all unknown)")
    bad = [f"{name}: declared {decl:.3g} {unit}, measured {meas:.3g} ({meas / decl:.2%} of it; expected "
           f"{lo:g}..{hi:g}x)" for name, meas, decl, unit, (lo, hi) in pairs if not lo <= meas / decl <= hi]
    if bad:
        raise CheckFailed(f"profile {prof.model!r} disagrees with what the perf level measured (measured / declared "
                          f"outside the stated factor): " + "; ".join(bad))
    return "; ".join(f"{n}: measured {m / d:.1%} of declared" for n, m, d, _, _ in pairs)


# (name, what it checks, function, where it runs, timeout in seconds)
_CHECKS: list[tuple[str, str, Callable, Where, float]] = [
    ("matmul", "matmul FLOP/s by dtype and square shape (median of repeats)", check_matmul, "rank0", 300),
    ("memory_bandwidth", "device memory bandwidth of a large copy", check_memory_bandwidth, "rank0", 120),
    ("collective_busbw", "collective bus bandwidth by message size (nccl-tests formulas)", check_collective_busbw,
     "all", 600),
    ("profile_agreement", "native only: declared profile figures agree with the measured ones (measured / "
     f"declared in [{AGREEMENT[0]:g}, {AGREEMENT[1]:g}], collective busbw vs intra-node link in "
     f"[{BUSBW_AGREEMENT[0]:g}, {BUSBW_AGREEMENT[1]:g}])", check_profile_agreement, "local", 30),
    ("efficiency_matrix", "the figures assemble into an EfficiencyMatrix that validates", check_efficiency_matrix,
     "local", 30),
]


def discover(target) -> list[Check]:
    return [Check(f"perf.{name}", "perf", doc, fn, where=where, timeout=timeout)
            for name, doc, fn, where, timeout in _CHECKS]
