"""What a conformance check is: a stable id, a level, a one-line purpose, and a function to run.

One engine serves both front ends: `hal conformance` runs the checks directly, and the pytest plugin
collects the very same `Check` objects as test items. A check function takes a context (the
worker's `WorkerContext`, or `LocalContext` for contract checks run in the calling process) plus
its `params`, and either returns a message (passed), raises `CheckFailed` (the message says what was
expected and what came), raises `CheckNotApplicable` (the property does not exist for this plugin as
it declares itself: a host-device chip has no second device to mix in) or `CheckSkipped` (the check
applies but could not run here: ccl_bridge missing, one rank). Any other exception is a failure that
names its type.

What a status means for the verdict: a run passes when no check failed. `not_applicable` never
counts against a plugin (not even under --fail-on-skip); `skipped` means "applies, not verified",
so `--fail-on-skip` (a strict certification run) fails on it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional

LEVELS: tuple[str, ...] = ("contract", "runtime", "ops", "collectives", "bridge", "errors", "perf")
CORE_LEVELS: tuple[str, ...] = ("contract", "runtime", "ops", "errors")

Where = Literal["local", "rank0", "all"]
Status = Literal["passed", "failed", "skipped", "not_applicable"]
STATUSES: tuple[str, ...] = ("passed", "failed", "skipped", "not_applicable")

# The runtime prerequisites, in the order they run (first in the runtime level): the device count is
# real (every counted device can be selected), every rank of the pool binds its own device, and the
# chip's process group forms among the ranks. When one fails, what depends on it is not run: it is
# `skipped` with "not run: prerequisite <id> failed: <its message>" (`prerequisites_of`), so a plugin
# broken at the root gets its verdict in minutes, the root cause first (`Report.root_cause`).
PREREQUISITES: tuple[str, ...] = ("runtime.device_count", "runtime.rank_devices", "runtime.process_group")
# Checks that read device_count() itself (besides the multi-rank ones, whose ranks pick LOCAL_RANK % count).
COUNT_DEPENDENT: tuple[str, ...] = ("runtime.device_selection", "errors.device_index_out_of_range")
NOT_RUN_PREREQUISITE = "not run: prerequisite"


class CheckFailed(AssertionError):
    """A check's verdict: the message says what was expected and what came."""


class CheckSkipped(Exception):
    """A check that applies but could not run here; the message says why."""


class CheckNotApplicable(CheckSkipped):
    """The property does not exist for this plugin as declared (e.g. no second device on a host
    chip, a dtype the runtime does not list): not a gap in the verification."""


@dataclass
class Passed:
    """A passing check's message plus data the report keeps (perf figures)."""

    message: str = ""
    data: Any = None


@dataclass(frozen=True)
class Check:
    """One check. `where`: run in the calling process ("local"), on rank 0 of the worker pool
    ("rank0"), or on every rank ("all", multi-process). `timeout` bounds one run in seconds: a check
    that outlives it failed (a hang), and the pool is restarted."""

    id: str
    level: str
    doc: str
    fn: Callable = field(repr=False, compare=False)
    params: tuple = ()
    where: Where = "rank0"
    timeout: float = 120.0

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"check {self.id!r}: level {self.level!r} is not one of {LEVELS}")
        if not self.id.startswith(self.level + "."):
            raise ValueError(f"check id {self.id!r} must start with its level {self.level!r} + '.'")


@dataclass
class CheckResult:
    """The outcome of one check, as the JSON report lists it (plus `data` for perf figures)."""

    id: str
    level: str
    status: Status
    message: str
    duration_s: float
    data: Any = None

    def as_json(self) -> dict:
        return {"id": self.id, "level": self.level, "status": self.status, "message": self.message,
                "duration_s": round(self.duration_s, 6)}


def prerequisites_of(check: Check) -> tuple[str, ...]:
    """The prerequisite ids `check` depends on, in run order: every multi-rank check (collectives,
    bridge, multi-rank errors, perf's collective bandwidth) on all three, a prerequisite on those
    before it, the checks that read device_count() on the count; nothing else (rank 0's own device
    and the contract level do not depend on the count)."""
    if check.id in PREREQUISITES:
        return PREREQUISITES[:PREREQUISITES.index(check.id)]
    if check.where == "all":
        return PREREQUISITES
    if check.id in COUNT_DEPENDENT:
        return PREREQUISITES[:1]
    return ()


def not_run_because(prerequisite: CheckResult) -> str:
    """A dependent check's message when `prerequisite` failed."""
    msg = " ".join(prerequisite.message.split())
    return f"{NOT_RUN_PREREQUISITE} {prerequisite.id} failed: {msg[:300]}{'...' if len(msg) > 300 else ''}"


def parse_levels(text: str) -> list[str]:
    """'contract,ops' -> ['contract', 'ops']; 'all' -> every level (in `LEVELS` order)."""
    names = [t.strip().lower() for t in (text or "all").split(",") if t.strip()]
    if not names or "all" in names:
        return list(LEVELS)
    if "core" in names:
        names = [n for n in names if n != "core"] + list(CORE_LEVELS)
    unknown = [n for n in names if n not in LEVELS]
    if unknown:
        raise ValueError(f"unknown level(s) {unknown}; choose from {', '.join(LEVELS)}, core or all")
    return [lvl for lvl in LEVELS if lvl in names]


def matches(check_id: str, patterns: Optional[list[str]]) -> bool:
    """True if `check_id` matches any glob in `patterns` (a pattern without glob characters matches as
    a substring, like pytest -k); no patterns selects everything."""
    if not patterns:
        return True
    from fnmatch import fnmatchcase
    for p in patterns:
        if any(ch in p for ch in "*?["):
            if fnmatchcase(check_id, p):
                return True
        elif p in check_id:
            return True
    return False


def run_check_fn(fn: Callable, ctx: Any, params: tuple) -> tuple[Status, str, Any]:
    """Run a check function and turn what happened into (status, message, data)."""
    try:
        out = fn(ctx, *params)
    except CheckNotApplicable as exc:
        return "not_applicable", str(exc), None
    except CheckSkipped as exc:
        return "skipped", str(exc), None
    except CheckFailed as exc:
        return "failed", str(exc), None
    except Exception as exc:  # a check that raises unexpectedly failed; say what it raised
        return "failed", f"raised {type(exc).__name__}: {exc}", None
    if isinstance(out, Passed):
        return "passed", out.message, out.data
    return "passed", "" if out is None else str(out), None
