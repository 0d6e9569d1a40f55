"""Slow-node detection for `hal train`: name a rank whose compute is slower than its chip's expected
time by more than a threshold, log it, and optionally write a re-plan with it weighted down.

Each step every rank reports its measured compute seconds: under timed emulation the emulated chip's
device time (hal.timed's clock `busy_s`: its ops at its speed, as CUDA events would time kernels on a
real chip; the host's overruns are left out, they are this host's load, not the chip), else the
training thread's CPU time. The detector divides it by the rank's EXPECTED
time and calibrates with the median over the world (robust to one or a few slow ranks):

  - timed emulation: expected = flops / F + bytes / B, with the FLOPs and bytes the rank's clock
    actually charged this step and (F, B) the speeds its chip's profile gives (captured before any
    throttle): what this chip should take for the work it did. A rank whose chip runs slower than its
    profile (throttled, or a host that cannot keep up) has a ratio above the others';
  - otherwise (every emulated chip runs on the same host CPU): expected = the rank's work share of
    the plan (trainer.metrics.work_shares) - equal CPU speed per unit of work.

A rank is slow when the median over the last `window` steps of (measured / expected) / (the world's
median of it) exceeds 1 + `threshold`. A slow LINK shows the other way round: the ranks behind it wait
(`rank_wait_share` in metrics.jsonl) while every compute ratio stays normal - the detector reports
compute stragglers only and says so.

`HAL_TRAIN_THROTTLE="rank:factor"` (TEST ONLY; several as "1:3,2:2") slows that rank's emulated chip
by `factor`: its timed-emulation clock charges every op `factor` times the profile's time (the chip
is slower, as a thermally throttled one is). It needs timed emulation (HAL_EMULATE_TIMED=1, or
cluster.timed = true): without a clock there is no emulated chip time to slow.

Re-plan (`slow_node.replan = true`): at the end the run writes `<run dir>/replan.json`, the run's Plan
with each stage's replica rows re-weighted by the measured rows per compute-second of each replica
(so a slow rank's replica gets fewer rows); resume with `hal train --plan <run dir>/replan.json`.
"""
from __future__ import annotations

import os
import statistics
from collections import deque
from typing import Optional

from hal.errors import HalError

ENV = "HAL_TRAIN_THROTTLE"


class ThrottleSpecError(HalError, ValueError):
    """HAL_TRAIN_THROTTLE is malformed or cannot apply; names the entry."""


def parse_throttle(text: str) -> dict[int, float]:
    """`2:3` -> {2: 3.0}; `1:2,3:4` -> {1: 2.0, 3: 4.0}."""
    out: dict[int, float] = {}
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        rank, sep, factor = item.partition(":")
        try:
            r, f = int(rank), float(factor)
        except ValueError:
            raise ThrottleSpecError(f"{ENV}={text!r}: entry {item!r} is not 'rank:factor' (e.g. '2:3')") from None
        if not sep or r < 0 or not f >= 1.0:
            raise ThrottleSpecError(f"{ENV}={text!r}: entry {item!r}: rank must be >= 0 and factor >= 1")
        out[r] = f
    return out


def apply_throttle(rank: int, clock) -> float:
    """Slow this rank's emulated chip as HAL_TRAIN_THROTTLE says; returns the factor (0.0: none)."""
    spec = parse_throttle(os.environ.get(ENV, ""))
    factor = spec.get(rank)
    if not factor:
        return 0.0
    if clock is None:
        raise ThrottleSpecError(f"{ENV}={os.environ.get(ENV)!r}: throttling rank {rank} needs timed emulation "
                                f"(HAL_EMULATE_TIMED=1 or cluster.timed = true in the config)")
    from hal.timed import Speeds
    s = clock.speeds
    clock.speeds = Speeds(s.flops_per_s / factor, s.bytes_per_s / factor,
                          f"{s.source}; THROTTLED x{factor:g} ({ENV}, test only)")
    return factor


class SlowNodeDetector:
    """Keeps each rank's last `window` ratios of measured / expected compute (see the module doc)."""

    def __init__(self, threshold: float, window: int, chips: list[str], shares: list[float],
                 speeds: list[tuple[float, float]], timed: bool) -> None:
        self.threshold, self.window = threshold, window
        self.chips, self.shares, self.speeds, self.timed = chips, shares, speeds, timed
        self.hist = [deque(maxlen=window) for _ in chips]
        self.steps = 0
        self.found: dict[int, dict] = {}

    def _expected(self, r: int, flops: float, nbytes: float) -> Optional[float]:
        if self.timed:
            F, B = self.speeds[r]
            return flops / F + nbytes / B if F > 0 and B > 0 and (flops or nbytes) else None
        return self.shares[r] or None

    def update(self, compute_s: list[float], flops: list[float], nbytes: list[float]) -> list[dict]:
        """One step's measurements; returns the ranks found slow at this step (each with its figures)."""
        self.steps += 1
        for r, c in enumerate(compute_s):
            e = self._expected(r, flops[r], nbytes[r])
            if e:
                self.hist[r].append((c / e, c, e))
        full = [r for r, h in enumerate(self.hist) if len(h) == self.window]  # idle ranks have none
        if len(full) < 2:
            return []
        med = {r: statistics.median(x[0] for x in self.hist[r]) for r in full}
        base = statistics.median(med.values())
        out = []
        for r, m in med.items():
            rel = m / base if base > 0 else 0.0
            if rel > 1.0 + self.threshold:
                f = {"rank": r, "chip": self.chips[r], "slowdown": rel, "threshold": self.threshold,
                     "measured_s": statistics.median(x[1] for x in self.hist[r]),
                     "expected_s": statistics.median(x[2] for x in self.hist[r]) * base,
                     "first_step": self.found.get(r, {}).get("first_step", self.steps)}
                self.found[r] = f
                out.append(f)
        return out

    def describe(self, f: dict) -> str:
        basis = ("its chip's profile speed for the FLOPs and bytes it ran (timed emulation)" if self.timed
                 else "its work share at the host CPU's speed (every chip emulated on one CPU)")
        return (f"rank {f['rank']} ({f['chip']}) computes {f['slowdown']:.2f}x its expected time "
                f"({f['measured_s'] * 1e3:.1f} ms vs {f['expected_s'] * 1e3:.1f} ms; expected from {basis}, "
                f"calibrated by the world's median; threshold {1 + self.threshold:.2f}x over {self.window} steps)")

    def findings(self) -> list[dict]:
        return [self.found[r] for r in sorted(self.found)]


def replan(plan, rank_step_compute: list[float]):
    """The plan with each stage's replica rows re-weighted by measured speed: replica j gets rows in
    proportion to rows_j / compute_j (its ranks' median compute seconds), at least 1, same total;
    layers, TP groups, experts and micro-batch count unchanged. A Plan (strategies.plan)."""
    data = plan.model_dump()
    for st in data["stages"]:
        reps = st["replicas"]
        total = sum(r["microbatch"] for r in reps)
        speed = []
        for r in reps:
            c = max(rank_step_compute[x] for x in r["ranks"])
            speed.append(r["microbatch"] / c if c > 0 else float(r["microbatch"]))
        raw = [total * s / sum(speed) for s in speed]
        rows = [max(1, int(x)) for x in raw]
        # hand the remainder to the largest fractional parts (then take back from the largest if over)
        order = sorted(range(len(rows)), key=lambda i: raw[i] - int(raw[i]) if raw[i] >= 1 else -1.0, reverse=True)
        i = 0
        while sum(rows) < total:
            rows[order[i % len(rows)]] += 1
            i += 1
        while sum(rows) > total:
            j = max(range(len(rows)), key=lambda k: rows[k])
            rows[j] -= 1
        for r, n in zip(reps, rows):
            r["microbatch"] = n
    return type(plan).from_dict(data)
