"""Per-rank link timing of `hal train`'s training collectives, for the slow-LINK check (hal.trainer.slow_node),
and the trainer component that runs that check (`SlowLinkCheck`).

What is MEASURED, per rank and step (on the `hetero` backend, ccl_bridge's Python process group): the
seconds this rank's own thread spends handing its data to its links - inside the group's submission
(`HeteroProcessGroup._submit`: argument checks, the caller's device event, the enqueue on the group's
executor), for every collective and every send it issues, kept per group and per peer (`send to 3`).
On a healthy bridge that is microseconds per op: the transfer runs on the group's executor and the
caller waits for it later. A rank whose link cannot take its data (the test-only delay below; a
congested or degraded link whose enqueue blocks the caller) is held there while its peers wait in the
collective for its data, so its issue time stands out against its PEERS' doing the same collectives.
Measured on the host's real clock (`time.perf_counter`), timed emulation or not: communication is not
emulated (hal.emulation.timed), it runs on the host's CPU fabric.

NOT measured: a transfer that is slow in flight (inside the bridge's executor, after the submission)
makes every member of the collective wait alike and shows only as higher `rank_wait_s` of the whole
group; it is not attributed to a rank. The `gloo` backend's process group is C++ (nothing to wrap):
there the check reports `measured: false`.

The test-only link delay (`[debug] link_delay = { 2 = 0.1 }`, hal.trainer.debug) makes that rank sleep
before each collective or send it submits on a `hetero` group (receives are not delayed), as a link that
accepts its data late would hold it; the config bounds it far below a collective's timeout.

`SlowLinkCheck` is the trainer's component: it installs the watch, reads each step's issue seconds, runs
the slow-link detector on every rank's figures and names the link of a rank it finds.
"""
from __future__ import annotations

import logging
import threading
import time

import torch.distributed as dist

log = logging.getLogger(__name__)


class _State:
    """This process's counters (one training rank per process) and its delay."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.delay_s = 0.0
        self.issue_s = 0.0
        self.ops = 0
        self.by_link: dict[str, list] = {}  # "group g: all_reduce" / "group g: send to 3" -> [seconds, ops]


_STATE = _State()
_INSTALLED: list[type] = []


def _link_key(pg, op: str) -> str:
    """`<group ranks>: <op>` with the peer of a send as a GLOBAL rank (the group's fabric maps it)."""
    fx = getattr(pg, "fabric", None)
    ranks = list(fx.global_ranks) if fx is not None and fx.global_ranks else (
        list(range(fx.world)) if fx is not None else [])
    if op.startswith("send to "):
        try:
            peer = int(op.rsplit(" ", 1)[1])
            op = f"send to {fx.global_rank(peer) if fx is not None else peer}"
        except (ValueError, IndexError, AttributeError):
            pass
    return f"{ranks}: {op}"


def _wrap(fn):
    def _submit(self, op, *args, **kwargs):
        s = _STATE
        if threading.current_thread() is not threading.main_thread():  # a group's own threads: not the rank's issue
            return fn(self, op, *args, **kwargs)
        t0 = time.perf_counter()
        try:
            if s.delay_s and not op.startswith("recv"):
                time.sleep(s.delay_s)  # debug.link_delay (test only): this rank's link takes its data late
            return fn(self, op, *args, **kwargs)
        finally:
            dt = time.perf_counter() - t0
            key = _link_key(self, op)
            with s.lock:
                s.issue_s += dt
                s.ops += 1
                e = s.by_link.setdefault(key, [0.0, 0])
                e[0] += dt
                e[1] += 1
    _submit._hal_link_watch = True  # type: ignore[attr-defined]
    _submit.__wrapped__ = fn  # type: ignore[attr-defined]
    return _submit


def start(backend: str, delay_s: float = 0.0) -> dict:
    """Install the watch (once per process), reset the counters and set this rank's test-only delay.
    Returns {"measured": bool, "delay_s": float, "basis": str}."""
    with _STATE.lock:
        _STATE.delay_s, _STATE.issue_s, _STATE.ops, _STATE.by_link = delay_s, 0.0, 0, {}
    if backend != "hetero":
        return {"measured": False, "delay_s": 0.0,
                "basis": f"not measured: backend {backend!r} has no Python process group to time"}
    from hal.ccl_bridge.process_group import HeteroProcessGroup
    fn = HeteroProcessGroup.__dict__["_submit"]
    if not getattr(fn, "_hal_link_watch", False):
        HeteroProcessGroup._submit = _wrap(fn)
        _INSTALLED.append(HeteroProcessGroup)
    return {"measured": True, "delay_s": delay_s,
            "basis": "seconds each rank's thread spends submitting its collectives and sends to the bridge"}


def stop() -> None:
    """Clear the delay (a pooled worker runs the next test's training in the same process)."""
    with _STATE.lock:
        _STATE.delay_s = 0.0


def issue_seconds() -> float:
    """Seconds spent submitting so far (read it before and after a step)."""
    return _STATE.issue_s


def by_link() -> dict[str, tuple[float, int]]:
    """Seconds and ops per (group, op/peer) so far."""
    with _STATE.lock:
        return {k: (v[0], v[1]) for k, v in _STATE.by_link.items()}


class SlowLinkCheck:
    """The trainer's slow-link component (every rank): installs the watch, measures each step's link issue
    seconds (`begin` / `issue_s`, gathered with the step's timings by hal.trainer.metrics), feeds every
    rank's figures to hal.trainer.slow_node.SlowLinkDetector and names the link of a newly found rank."""

    def __init__(self, cfg, chips: list[str], backend: str, book, delay_s: float = 0.0,
                 delays: dict | None = None) -> None:
        from .slow_node import SlowLinkDetector
        self.rank, self.world, self.book = dist.get_rank(), dist.get_world_size(), book
        self.info = start(backend, delay_s)
        self.delays = dict(delays or {})
        sn = cfg.slow_node
        self.detector = SlowLinkDetector(sn.threshold, sn.link_threshold, sn.window, chips)
        self._issue0 = 0.0

    def begin(self) -> None:
        self._issue0 = issue_seconds()

    def issue_s(self) -> float:
        """This rank's seconds submitting to its links since `begin`."""
        return issue_seconds() - self._issue0

    def after_step(self, rec: dict) -> None:
        """Every rank, on the step's record (its per-rank figures are the same everywhere): run the check,
        name the link of each newly found rank (collective, the same decision on every rank), log it once."""
        found = self.detector.update(rec["rank_link_issue_s"], rec["rank_step_s"], rec["rank_wait_s"])
        if not found:
            return
        rec["slow_link_ranks"] = [f["rank"] for f in found]
        new = [f for f in found if f.get("link") is None]
        if not new:
            return
        from .slow_node import name_link
        per_rank: list = [None] * self.world
        dist.all_gather_object(per_rank, by_link(), group=self.book)
        for f in new:
            f["link"] = name_link(f["rank"], per_rank, self.detector.chips)
            if self.rank == 0:
                log.info("  SLOW LINK at step %d: %s", rec["step"], self.detector.describe(f))

    def summary(self) -> dict:
        return {"slow_links": self.detector.findings(), "link_measure": self.info,
                "link_delayed": [{"rank": r, "seconds": d} for r, d in sorted(self.delays.items())]}

    def close(self) -> None:
        stop()
