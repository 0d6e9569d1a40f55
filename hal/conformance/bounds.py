"""Time bounds of a conformance run: every check ends, every level ends, the whole run ends.

Whatever the plugin does (a hook that never returns, a collective that blocks, a worker that dies),
the suite gives a verdict within a bound it can state up front:

- each check has a timeout; a worker-side check that outlives it is cut (the pool is killed and
  replaced) and fails with where each rank was stuck (a `faulthandler` dump taken just before the
  cut); an in-process check (the contract level, loading the plugin) runs in a daemon thread and is
  abandoned when it outlives its timeout, with that thread's stack in the message;
- binding the chip in the workers is bounded too; a binding that hung once is not retried: every
  later check that needs it fails at once, naming the hang;
- each level has a time budget (`LEVEL_BUDGET_S`, scaled by `--timeout` above 60 s); a check never
  gets more time than its level has left, and once the budget is spent the level's remaining checks
  fail at once ("not run: the level's budget ... was spent").

So a run over `levels` ends within `hard_bound(levels, timeout)` seconds (the sum of the level
budgets plus plugin loading, pool start-ups and teardown slack), which docs/conformance.md states
for `--level all`.
"""
from __future__ import annotations

import os
import re
import sys
import threading
import traceback
from typing import Any, Callable, Iterable, Optional

# Seconds per level at the default --timeout of 60 s. A correct plugin needs a small fraction of these
# (on a 2-core host, `--level all` on `cpu` takes about a minute); they exist for the broken ones.
LEVEL_BUDGET_S = {"contract": 60.0, "runtime": 120.0, "ops": 240.0, "collectives": 420.0, "bridge": 300.0,
                  "errors": 150.0, "perf": 300.0}
LOAD_TIMEOUT_S = 30.0      # importing the plugin and calling its registration hooks, in this process
LOCAL_CHECK_TIMEOUT_S = 20.0  # one contract check (hook calls in this process)
POOL_START_TIMEOUT_S = 180.0  # spawning the workers and importing torch (no plugin code yet)
BIND_TIMEOUT_S = 60.0      # binding the chip in every worker (plugin import, hooks, device runtime)
TEARDOWN_SLACK_S = 30.0    # killing pools, writing reports
STACK_FRAMES = 3


def level_budget(level: str, group_timeout_s: float = 60.0) -> float:
    """The budget of `level`: the table's figure, scaled up when --timeout is above 60 s (checks then
    legitimately wait longer for a collective to time out)."""
    return LEVEL_BUDGET_S[level] * max(1.0, group_timeout_s / 60.0)


def hard_bound(levels: Iterable[str], group_timeout_s: float = 60.0) -> float:
    """Seconds within which a run of `levels` ends, whatever the plugin does."""
    # Pool start-ups are not charged to a level: at most one per level (after a hang or a death the
    # next check's start-up is charged to the level's budget through the check's own timeout).
    return (LOAD_TIMEOUT_S + sum(level_budget(lvl, group_timeout_s) + POOL_START_TIMEOUT_S for lvl in levels)
            + TEARDOWN_SLACK_S)


class Hung(Exception):
    """An in-process call that did not return within its bound; the message says where it was stuck."""


def call_bounded(fn: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """`fn()` in a daemon thread; its value (or its exception), or `Hung` after `timeout_s` naming the
    frames the thread was stuck in. A stuck thread is abandoned (a daemon: it does not keep the
    process alive); what it holds stays held, which is why worker-side checks are preferred."""
    box: dict = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller as is
            box["error"] = exc

    th = threading.Thread(target=target, name=f"hal-conformance: {what}", daemon=True)
    th.start()
    th.join(timeout_s)
    if th.is_alive():
        frame = sys._current_frames().get(th.ident) if th.ident is not None else None
        where = _frames(traceback.extract_stack(frame)) if frame is not None else "unknown"
        raise Hung(f"{what} did not return within {timeout_s:g} s (a hang); stuck at {where}")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _frames(stack: traceback.StackSummary) -> str:
    """The innermost frames of a stack, outside this module and the threading machinery."""
    keep = [f for f in stack if not f.filename.endswith(("threading.py", "bounds.py"))]
    inner = keep[-STACK_FRAMES:][::-1]
    return " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}" for f in inner) or "unknown"


# ---- worker side: a faulthandler dump just before the pool's timeout cuts the call ----------------
_ARMED: Optional[Any] = None


def arm_stack_dump(path: Optional[str], after_s: float) -> None:
    """In a worker: dump every thread's stack to `path` if the call is still running after `after_s`."""
    global _ARMED
    disarm_stack_dump()
    if not path or after_s <= 0:
        return
    import faulthandler
    _ARMED = open(path, "w")
    faulthandler.dump_traceback_later(after_s, repeat=False, file=_ARMED, exit=False)


def disarm_stack_dump() -> None:
    global _ARMED
    if _ARMED is not None:
        import faulthandler
        faulthandler.cancel_dump_traceback_later()
        _ARMED.close()
        _ARMED = None


_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')
_PLUMBING = ("hal/conformance/worker.py", "hal/conformance/checks.py", "hal/testing/worker_pool.py", "multiprocessing/",
             "threading.py")


def stuck_at(path: str) -> Optional[str]:
    """Where the worker's call thread was stuck, read from its faulthandler dump (None: no dump)."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    for block in text.split("\n\n"):
        if "run_check" not in block and "prepare" not in block:
            continue  # another thread (a watchdog, a bridge executor): not the one running the check
        frames = [(os.path.basename(p), int(n), fn) for p, n, fn in _FRAME.findall(block)
                  if not any(s in p for s in _PLUMBING)]
        if frames:
            return " <- ".join(f"{p}:{n} in {fn}" for p, n, fn in frames[:STACK_FRAMES])
    return None


def multi_rank_timeout(group_timeout_s: float) -> float:
    """A multi-rank check's timeout: twice the group's (a case may wait one group timeout for a peer
    that raised, then the agreement another) plus time for the cases themselves."""
    return max(20.0, 2 * group_timeout_s + 10)
