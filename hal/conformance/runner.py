"""Runs checks: contract checks in this process, the rest on a `hal.testing.WorkerPool`.

One pool serves a whole run (and may serve several runs: the pool is plugin-agnostic, each worker
rebinds when the spec changes). A check that outlives its timeout, or a worker that dies (an abort
in a vendor library), fails that check with what happened; the pool is then replaced so the next
check starts clean. Rank results are merged: a check failed if any rank failed, and the message
names the ranks.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Callable, Iterable, Optional

from hal.testing import WorkerPool

from . import bounds, worker
from .checks import PREREQUISITES, Check, CheckResult, not_run_because, prerequisites_of, run_check_fn
from .target import LocalContext, Target, on_host

_SIGNALS = {6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM", 7: "SIGBUS", 8: "SIGFPE"}


class PoolHandle:
    """Lazily started worker pools, one per world size (the bridge level may need more ranks than
    --nproc), each replaced after a hang or a death. `nproc` is the default size. Starting a pool of
    another size closes the others, or with `keep_other` keeps the most recent one idle (ranks on
    host tensors: an idle worker holds no device, and the run usually comes back to it, e.g. errors
    and perf after the bridge's 3 ranks on a 2-rank run)."""

    def __init__(self, nproc: int, env: Optional[dict] = None):
        self.nproc = nproc
        self.env = env or {}
        self._pools: dict[int, WorkerPool] = {}
        self.starts = 0

    @property
    def _pool(self) -> Optional[WorkerPool]:
        return self._pools.get(self.nproc)

    def get(self, size: Optional[int] = None, keep_other: bool = False) -> WorkerPool:
        size = size or self.nproc
        pool = self._pools.get(size)
        if pool is None or not all(pool.alive()):
            if pool is not None:
                self.discard(size)
            others = [s for s in self._pools if s != size]
            for other in others[:-1] if keep_other else others:
                self.discard(other)  # no busy pool beside this one: the host's cores are shared
            self._pools[size] = pool = WorkerPool(size, env=self.env)
            self.starts += 1
        return pool

    def warm_size(self) -> Optional[int]:
        """The size of a pool that is up (its workers alive), if any."""
        return next((size for size, pool in self._pools.items() if all(pool.alive())), None)

    def current(self, size: Optional[int] = None) -> Optional[WorkerPool]:
        return self._pools.get(size or self.nproc)

    def discard(self, size: Optional[int] = None) -> None:
        pool = self._pools.pop(size or self.nproc, None)
        if pool is not None:
            pool.close(kill=True)

    def close(self) -> None:
        # Every result is already back; killing skips the workers' slow interpreter teardown.
        for size in list(self._pools):
            self.discard(size)

    def __enter__(self) -> "PoolHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _died(outcome, pool) -> str:
    """What a dead worker's exit says (a signal: it aborted or crashed instead of raising)."""
    procs = getattr(pool, "_procs", None)  # WorkerPool keeps its processes; read the exit code
    code = None
    if procs is not None and 0 <= outcome.rank < len(procs):
        procs[outcome.rank].join(5)
        code = procs[outcome.rank].exitcode
    if code is None:
        return outcome.error or "worker process died"
    if code < 0:
        name = _SIGNALS.get(-code, f"signal {-code}")
        return (f"worker process died of {name} (exit code {code}): it aborted or crashed instead of raising a "
                f"typed error")
    return f"worker process exited with code {code} instead of returning or raising"


class Runner:
    """Runs `Check`s for one target and returns `CheckResult`s, each within its bound (see `bounds`)."""

    def __init__(self, target: Target, pool: Optional[PoolHandle] = None,
                 on_result: Optional[Callable[[CheckResult], None]] = None,
                 budgets: Optional[dict[str, float]] = None, bind_timeout_s: Optional[float] = None):
        self.target = target
        self._own_pool = pool is None
        self.pool = pool or PoolHandle(target.nproc)  # a shared handle may default to another size
        self.on_result = on_result
        self.local = LocalContext(target)
        self._bound: dict = {}
        self.budgets = budgets or {}
        self._deadline: dict[str, float] = {}
        self._hangs: dict[str, list[str]] = {}
        self._bind_hung: dict = {}  # WorkerSpec -> why binding it did not finish
        self._stacks = tempfile.mkdtemp(prefix="hal-conformance-stacks-")
        self._started: set = set()
        self._free_start: set = set()
        self._prereq_failed: dict[str, CheckResult] = {}  # prerequisite id -> its failed result
        self.bind_timeout_s = bind_timeout_s or bounds.BIND_TIMEOUT_S
        self._one_rank = False  # set by run(): no selected check needs more than rank 0
        self._keep = on_host(target)  # keep an idle pool of another size (PoolHandle.get)

    def run(self, checks: Iterable[Check]) -> list[CheckResult]:
        checks = list(checks)
        # `--level ops`, `-k matmul`: every worker-side check runs on rank 0 alone, so one worker
        # does (a warm pool of any size serves too); no --nproc processes to spawn for nothing.
        self._one_rank = all(c.where != "all" for c in checks)
        results = []
        for check in checks:
            res = self.run_one(check)
            results.append(res)
            if self.on_result:
                self.on_result(res)
        return results

    def run_one(self, check: Check) -> CheckResult:
        """Run `check` and remember its result (local checks may read earlier results). A check whose
        prerequisite failed in this run is not run: skipped, naming the prerequisite (`prerequisites_of`)."""
        res = self._blocked(check) or self._run(check)
        if check.id in PREREQUISITES and res.status == "failed":
            self._prereq_failed[check.id] = res
        self.local.results[res.id] = res
        if res.status == "failed" and "(a hang" in res.message:
            self._hangs.setdefault(check.level, []).append(check.id)
        return res

    def _blocked(self, check: Check) -> Optional[CheckResult]:
        for pid in prerequisites_of(check):
            if pid in self._prereq_failed:
                return CheckResult(check.id, check.level, "skipped", not_run_because(self._prereq_failed[pid]), 0.0)
        return None

    def _left(self, level: str) -> float:
        """Seconds the level has left (its clock starts with its first check)."""
        if level not in self._deadline:
            budget = self.budgets.get(level, bounds.level_budget(level, self.target.group_timeout_s))
            self._deadline[level] = time.monotonic() + budget
        return self._deadline[level] - time.monotonic()

    def _run(self, check: Check) -> CheckResult:
        left = self._left(check.level)
        if left <= 0:
            hung = self._hangs.get(check.level, [])
            more = "..." if len(hung) > 3 else ""
            return CheckResult(check.id, check.level, "failed", "not run: the level's time budget was spent "
                               f"({len(hung)} check(s) hung: {', '.join(hung[:3]) or 'none'}{more}); "
                               "see docs/conformance.md, 'Time bounds'", 0.0)
        if check.where == "local":
            t0 = time.perf_counter()
            timeout = min(check.timeout, bounds.LOCAL_CHECK_TIMEOUT_S, left)
            try:
                status, message, data = bounds.call_bounded(
                    lambda: run_check_fn(check.fn, self.local, check.params), timeout, f"check {check.id}")
            except bounds.Hung as exc:
                status, message, data = "failed", str(exc), None
            return CheckResult(check.id, check.level, status, message, time.perf_counter() - t0, data)
        if self.target.load_error:
            return CheckResult(check.id, check.level, "skipped", "not run: the plugin did not load "
                               "(see contract.registers)", 0.0)
        spec = check_spec(self.target, check)
        size = len(spec.chips) or self.target.nproc
        if self._one_rank and check.where == "rank0" and not spec.chips:
            size = self.pool.warm_size() or 1
        if check.where == "all" and size < 2:
            return CheckResult(check.id, check.level, "skipped", f"needs >= 2 ranks, --nproc is "
                               f"{self.target.nproc}", 0.0)
        if spec in self._bind_hung:
            return CheckResult(check.id, check.level, "failed", f"not run: {self._bind_hung[spec]}", 0.0)
        why = self._start(size, check.level)
        if why:
            return CheckResult(check.id, check.level, "failed", why, 0.0)
        left = self._left(check.level)  # a start-up after a hang or a death is charged to the level
        if left <= 0:
            return CheckResult(check.id, check.level, "failed", "not run: the level's time budget was spent "
                               "restarting the worker pool", 0.0)
        t0 = time.perf_counter()  # the pool's start-up is not the plugin's time; its binding is
        why = self._bind(spec, size, min(bounds.BIND_TIMEOUT_S, left))
        if why:
            return CheckResult(check.id, check.level, "failed", why, time.perf_counter() - t0)
        t0 = time.perf_counter()  # pool start and binding are not the check's time
        timeout = min(check.timeout, self._left(check.level))
        if timeout <= 0:
            return CheckResult(check.id, check.level, "failed", "not run: the level's time budget was spent "
                               "binding the chip", 0.0)
        ranks = [0] if check.where == "rank0" else None
        stack = os.path.join(self._stacks, "check")
        try:
            pool = self.pool.get(size, self._keep)
            outcomes = pool.run(worker.run_check, spec, check.where, check.fn, check.params, stack,
                                _dump_after(timeout), timeout=timeout, check=False, ranks=ranks)
        except TimeoutError:
            self.pool.discard(size)
            return CheckResult(check.id, check.level, "failed", f"did not finish within {timeout:g}s "
                               f"(a hang: some call neither returned nor raised){_where(stack, size)}; "
                               f"worker pool restarted", time.perf_counter() - t0)
        return self._merge(check, outcomes, time.perf_counter() - t0, size)

    def _start(self, size: int, level: str) -> Optional[str]:
        """Start the pool of `size` ranks if it is not up (spawn + import torch); a message if that hung."""
        pool = self.pool.get(size, self._keep)
        if id(pool) not in self._started:
            t0 = time.monotonic()
            try:  # spawn + import torch: no plugin code runs yet, so this is not the plugin's time
                pool.run(worker.ping, timeout=bounds.POOL_START_TIMEOUT_S, check=False)
            except TimeoutError:
                self.pool.discard(size)
                return f"the worker pool of {size} processes did not start within {bounds.POOL_START_TIMEOUT_S:g}s"
            self._started.add(id(pool))
            if level not in self._free_start:  # one start-up per level is not charged to its budget
                self._free_start.add(level)
                self._deadline[level] = self._deadline.get(level, time.monotonic()) + time.monotonic() - t0
        return None

    def _bind(self, spec, size: int, timeout: float) -> Optional[str]:
        """Bind `spec` on every rank of the started pool; a message if that hung (remembered: the
        binding is not retried, every later check needing it fails at once)."""
        pool = self.pool.get(size, self._keep)
        if self._bound.get(id(pool)) == spec:
            return None
        timeout = min(timeout, self.bind_timeout_s)
        stack = os.path.join(self._stacks, "bind")
        try:
            pool.run(worker.prepare, spec, stack, _dump_after(timeout), timeout=timeout, check=False)
        except TimeoutError:
            self.pool.discard(size)
            chips = sorted(set(spec.chips or (spec.chip,)))
            why = (f"binding chip(s) {chips} (plugins {list(spec.plugins)}) in the workers did not finish within "
                   f"{timeout:g}s (a hang in a plugin hook or the device runtime){_where(stack, size)}")
            self._bind_hung[spec] = why
            return why
        self._bound = {id(pool): spec}
        return None

    def _merge(self, check: Check, outcomes: list, seconds: float, size: int) -> CheckResult:
        per_rank = []
        dead = False
        for o in outcomes:
            if not o.ok:
                dead = dead or o.died
                why = _died(o, self.pool.current(size)) if o.died else f"worker error {o.error}"
                per_rank.append((o.rank, "failed", why, None))
            else:
                per_rank.append((o.rank, o.value["status"], o.value["message"], o.value["data"]))
        if dead:
            self.pool.discard(size)
        failed = [(r, m) for r, s, m, _ in per_rank if s == "failed"]
        data = per_rank[0][3] if len(per_rank) == 1 else [d for *_, d in per_rank]
        if failed:
            return CheckResult(check.id, check.level, "failed", _by_rank(failed, len(per_rank)), seconds, data)
        for status in ("not_applicable", "skipped"):
            if all(s == status for _, s, _, _ in per_rank):
                return CheckResult(check.id, check.level, status, per_rank[0][2], seconds, data)
        passed = [(r, m) for r, s, m, _ in per_rank if s == "passed"]
        return CheckResult(check.id, check.level, "passed", _by_rank(passed, len(per_rank)), seconds, data)

    def close(self) -> None:
        if self._own_pool:
            self.pool.close()
        shutil.rmtree(self._stacks, ignore_errors=True)


def _dump_after(timeout: float) -> float:
    """When a worker dumps its stacks: shortly before the pool's timeout cuts the call."""
    return max(0.5, timeout - min(2.0, 0.2 * timeout))


def _where(stack_prefix: str, size: int) -> str:
    """'; stuck at: rank 0 at x.py:12 in f; rank 1 ...' from the workers' faulthandler dumps."""
    seen = []
    for r in range(size):
        at = bounds.stuck_at(f"{stack_prefix}.rank{r}")
        if at:
            seen.append(f"rank {r} at {at}")
    return ("; stuck: " + "; ".join(seen)) if seen else ""


def check_spec(target: Target, check: Check):
    """The worker spec a check runs under (the bridge level binds a mixed cluster)."""
    builder = getattr(check.fn, "worker_spec", None)
    return builder(target) if builder else target.spec()


def _by_rank(items: list[tuple[int, str]], world: int) -> str:
    """Group identical per-rank messages: 'ranks 0,1: msg' (or the bare message on one rank)."""
    if world == 1:
        return items[0][1]
    groups: dict[str, list[int]] = {}
    for r, m in items:
        groups.setdefault(m, []).append(r)
    if len(groups) == 1 and len(items) == world:
        return next(iter(groups))
    parts = []
    for m, ranks in groups.items():
        label = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {','.join(map(str, ranks))}"
        parts.append(f"{label}: {m}" if m else label)
    return "; ".join(parts)
