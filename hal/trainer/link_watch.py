"""Per-rank link timing of `hal train`'s training collectives, for the slow-LINK check (hal.trainer.slow_node),
and the test-only link delay HAL_TRAIN_LINK_DELAY.

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

`HAL_TRAIN_LINK_DELAY="rank:seconds"` (TEST ONLY; several as "1:0.05,3:0.02"): that rank sleeps
`seconds` before each collective or send it submits on a `hetero` group (receives are not delayed),
as a link that accepts its data late would hold it - bounded: at most MAX_DELAY_S per op, far below a
collective's timeout.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Optional

from hal.contract.errors import HalError

ENV = "HAL_TRAIN_LINK_DELAY"
MAX_DELAY_S = 1.0


class LinkDelaySpecError(HalError, ValueError):
    """HAL_TRAIN_LINK_DELAY is malformed or out of bounds; names the entry."""


def parse_link_delay(text: str) -> dict[int, float]:
    """`2:0.05` -> {2: 0.05}; `1:0.1,3:0.02` -> {1: 0.1, 3: 0.02}."""
    out: dict[int, float] = {}
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        rank, sep, secs = item.partition(":")
        try:
            r, s = int(rank), float(secs)
        except ValueError:
            raise LinkDelaySpecError(f"{ENV}={text!r}: entry {item!r} is not 'rank:seconds' (e.g. '2:0.05')") from None
        if not sep or r < 0 or not 0.0 < s <= MAX_DELAY_S:
            raise LinkDelaySpecError(f"{ENV}={text!r}: entry {item!r}: rank must be >= 0 and seconds in "
                                     f"(0, {MAX_DELAY_S:g}] (a bounded delay, below any collective timeout)")
        out[r] = s
    return out


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
                time.sleep(s.delay_s)  # HAL_TRAIN_LINK_DELAY (test only): this rank's link takes its data late
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


def start(rank: int, backend: str) -> dict:
    """Install the watch (once per process), reset the counters and set this rank's delay from the
    environment. Returns {"measured": bool, "delay_s": float, "basis": str}."""
    delay = parse_link_delay(os.environ.get(ENV, "")).get(rank, 0.0)
    with _STATE.lock:
        _STATE.delay_s, _STATE.issue_s, _STATE.ops, _STATE.by_link = delay, 0.0, 0, {}
    if backend != "hetero":
        if delay:
            raise LinkDelaySpecError(f"{ENV}={os.environ.get(ENV)!r}: delaying rank {rank}'s link needs backend "
                                     f"'hetero' (the bridge's Python group), not {backend!r}")
        return {"measured": False, "delay_s": 0.0,
                "basis": f"not measured: backend {backend!r} has no Python process group to time"}
    from hal.ccl_bridge.process_group import HeteroProcessGroup
    fn = HeteroProcessGroup.__dict__["_submit"]
    if not getattr(fn, "_hal_link_watch", False):
        HeteroProcessGroup._submit = _wrap(fn)
        _INSTALLED.append(HeteroProcessGroup)
    return {"measured": True, "delay_s": delay,
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


def delay_of(rank: int) -> Optional[float]:
    """The test-only delay HAL_TRAIN_LINK_DELAY gives `rank` (None: none)."""
    return parse_link_delay(os.environ.get(ENV, "")).get(rank)
