"""Slow-node detection for `hal train`: name a rank whose compute is slower than its chip's expected
time by more than a threshold, log it, and optionally write a re-plan with it weighted down.

Each step every rank reports its measured compute seconds: under timed emulation the emulated chip's
device time (hal.emulation.timed's clock `busy_s`: its ops at its speed, as CUDA events would time kernels on a
real chip; the host's overruns are left out, they are this host's load, not the chip), else the
training thread's CPU time. The detector divides it by the rank's EXPECTED
time and calibrates with the median over the world (robust to one or a few slow ranks):

  - timed emulation: expected = flops / F + bytes / B, with the FLOPs and bytes the rank's clock
    actually charged this step and (F, B) the speeds its chip's profile gives (captured before any
    throttle): what this chip should take for the work it did. A rank whose chip runs slower than its
    profile (throttled, or a host that cannot keep up) has a ratio above the others';
  - otherwise (every emulated chip runs on the same host CPU): expected = the rank's work share of
    the plan (hal.trainer.metrics.work_shares) - equal CPU speed per unit of work.

A rank is slow when the median over the last `window` steps of (measured / expected) / (the world's
median of it) exceeds 1 + `threshold`.

Slow LINK (`SlowLinkDetector`): every step each rank's LINK ISSUE seconds (hal.trainer.link_watch: the time
its own thread spends submitting its collectives and sends to the bridge; microseconds on a healthy
link, the transfer itself runs on the bridge's executor) are compared with its PEERS' doing the same
collectives. A rank is a slow link when, over the last `window` steps, the median of its issue time
exceeds its peers' median by more than `link_threshold` x the median step time AND by more than
(1 + `threshold`) x the peers' figure; its peers meanwhile wait for its data (their `rank_wait_s`).
The finding names the rank, its chip and the link - the group (its global ranks, whether it crosses
the bridge between chip kinds) or the send peer where its excess went (`name_link`). A transfer slow in
flight (after the submission) raises every member's wait alike and is not attributed (link_watch).

The test-only throttle (`[debug] throttle = { 1 = 4.0 }`, hal.trainer.debug) slows a rank's emulated chip
(its timed-emulation clock charges every op that many times the profile's time), as a thermally throttled
chip is slower; the test-only link delay is `[debug] link_delay` (hal.trainer.link_watch).

Re-plan (`slow_node.replan = true`): `replan` gives the run's Plan with each stage's replica rows
re-weighted by the measured rows per compute-second of each replica (a slow rank's replica gets fewer
rows). Mid-run, when a slow node is confirmed, hal.trainer.replan checkpoints, writes `<run dir>/replan.json`
and ends the ranks with EXIT_REPLAN so that torchrun (`hal train --max-restarts N`, N >= 1) restarts them
on the re-weighted plan; without a restart left it logs that a re-plan is recommended and goes on. At
the end of a run with slow nodes replan.json is (re)written from the whole run's medians.
"""
from __future__ import annotations

import statistics
from collections import deque
from typing import Optional


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


class SlowLinkDetector:
    """Keeps each rank's last `window` (link issue s, step s, wait s) and flags a rank whose issue time
    stands out against its peers' (see the module doc)."""

    def __init__(self, threshold: float, link_threshold: float, window: int, chips: list[str]) -> None:
        self.threshold, self.link_threshold, self.window, self.chips = threshold, link_threshold, window, chips
        self.hist = [deque(maxlen=window) for _ in chips]
        self.steps = 0
        self.found: dict[int, dict] = {}

    def update(self, issue_s: list[float], step_s: list[float], wait_s: list[float]) -> list[dict]:
        """One step's measurements; returns the ranks found slow at this step (new or still slow)."""
        self.steps += 1
        for r in range(len(self.chips)):
            self.hist[r].append((issue_s[r], step_s[r], wait_s[r]))
        if len(self.chips) < 2 or len(self.hist[0]) < self.window:
            return []
        med = [statistics.median(x[0] for x in h) for h in self.hist]
        step = statistics.median(statistics.median(x[1] for x in h) for h in self.hist)
        out = []
        for r, m in enumerate(med):
            peers = [med[j] for j in range(len(med)) if j != r]
            base = statistics.median(peers)
            excess = m - base
            if excess > self.link_threshold * step and m > (1.0 + self.threshold) * base:
                f = {"rank": r, "chip": self.chips[r], "issue_s": m, "peers_issue_s": base, "excess_s": excess,
                     "step_share": excess / step if step > 0 else 0.0, "step_s": step,
                     "peers_wait_s": statistics.median(statistics.median(x[2] for x in self.hist[j])
                                                       for j in range(len(med)) if j != r),
                     "threshold": self.threshold, "link_threshold": self.link_threshold,
                     "first_step": self.found.get(r, {}).get("first_step", self.steps)}
                f["link"] = self.found.get(r, {}).get("link")
                self.found[r] = f
                out.append(f)
        return out

    def describe(self, f: dict) -> str:
        link = f.get("link") or {}
        where = f"; link: {link['what']}" if link.get("what") else ""
        return (f"rank {f['rank']} ({f['chip']}) spends {f['issue_s'] * 1e3:.1f} ms per step handing its data to "
                f"its links vs {f['peers_issue_s'] * 1e3:.2f} ms for its peers ({f['step_share'] * 100:.0f}% of the "
                f"{f['step_s'] * 1e3:.0f} ms step; peers wait {f['peers_wait_s'] * 1e3:.0f} ms per step; threshold "
                f"{f['link_threshold'] * 100:.0f}% of a step over {self.window} steps){where}")

    def findings(self) -> list[dict]:
        return [self.found[r] for r in sorted(self.found)]


def name_link(rank: int, per_rank_links: list[dict], chips: list[str]) -> dict:
    """Which link of `rank` its issue time went to: of its (group, op) keys from hal.trainer.link_watch, the
    one with the largest excess over the peers' mean seconds per op on the same group and op kind (a send
    counts against the group's other sends). {"key", "excess_s", "group", "peer", "chips", "across_bridge",
    "what"}; {} when the rank recorded nothing."""
    def split(key: str) -> tuple[str, str]:
        group, _, op = key.partition(": ")
        return group, op

    def kind(op: str) -> str:
        return "send" if op.startswith("send to ") else op

    best: Optional[tuple[float, str]] = None
    for key, (sec, ops) in per_rank_links[rank].items():
        group, op = split(key)
        peer_sec = peer_ops = 0.0
        for j, links in enumerate(per_rank_links):
            if j == rank:
                continue
            for k2, (s2, o2) in links.items():
                g2, op2 = split(k2)
                if g2 == group and kind(op2) == kind(op):
                    peer_sec, peer_ops = peer_sec + s2, peer_ops + o2
        excess = sec - ops * (peer_sec / peer_ops if peer_ops else 0.0)
        if best is None or excess > best[0]:
            best = (excess, key)
    if best is None:
        return {}
    group, op = split(best[1])
    try:
        ranks = [int(x) for x in group.strip("[]").split(",") if x.strip()]
    except ValueError:
        ranks = []
    peer = int(op.rsplit(" ", 1)[1]) if op.startswith("send to ") and op.rsplit(" ", 1)[1].isdigit() else None
    members = [peer] if peer is not None else [x for x in ranks if x != rank]
    kinds = sorted({chips[x] for x in members + [rank] if 0 <= x < len(chips)})
    across = len(kinds) > 1
    if peer is not None:
        what = (f"sends from rank {rank} ({chips[rank]}) to rank {peer} ({chips[peer]}), "
                + ("across the bridge" if across else f"inside the {chips[rank]} sub-cluster"))
    else:
        what = (f"{op} of group ranks {ranks} ("
                + (f"across the bridge: {' <-> '.join(kinds)}" if across else f"inside the {kinds[0]} sub-cluster")
                + f"), rank {rank} on the {chips[rank]} side")
    return {"key": best[1], "excess_s": best[0], "group": ranks, "peer": peer, "chips": kinds,
            "across_bridge": across, "what": what}


def replan(plan, rank_step_compute: list[float]):
    """The plan with each stage's replica rows re-weighted by measured speed: replica j gets rows in
    proportion to rows_j / compute_j (its ranks' median compute seconds), at least 1, same total;
    layers, TP groups, experts and micro-batch count unchanged. A Plan (hal.strategies.plan)."""
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
