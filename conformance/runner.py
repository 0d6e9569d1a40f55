"""Runs checks: contract checks in this process, the rest on a `hal.testing.WorkerPool`.

One pool serves a whole run (and may serve several runs: the pool is plugin-agnostic, each worker
rebinds when the spec changes). A check that outlives its timeout, or a worker that dies (an abort
in a vendor library), fails that check with what happened; the pool is then replaced so the next
check starts clean. Rank results are merged: a check failed if any rank failed, and the message
names the ranks.
"""
from __future__ import annotations

import time
from typing import Callable, Iterable, Optional

from hal.testing import WorkerPool

from . import worker
from .checks import Check, CheckResult, run_check_fn
from .target import LocalContext, Target

_SIGNALS = {6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM", 7: "SIGBUS", 8: "SIGFPE"}


class PoolHandle:
    """A lazily started worker pool that is replaced after a hang or a death."""

    def __init__(self, nproc: int, env: Optional[dict] = None):
        self.nproc = nproc
        self.env = env or {}
        self._pool: Optional[WorkerPool] = None
        self.starts = 0

    def get(self) -> WorkerPool:
        if self._pool is None or not all(self._pool.alive()):
            if self._pool is not None:
                self._pool.close(kill=True)
            self._pool = WorkerPool(self.nproc, env=self.env)
            self.starts += 1
        return self._pool

    def discard(self) -> None:
        if self._pool is not None:
            self._pool.close(kill=True)
            self._pool = None

    def close(self) -> None:
        # Every result is already back; killing skips the workers' slow interpreter teardown.
        self.discard()

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
        return f"worker process died of {name} (exit code {code}): it aborted or crashed instead of raising a typed error"
    return f"worker process exited with code {code} instead of returning or raising"


class Runner:
    """Runs `Check`s for one target and returns `CheckResult`s."""

    def __init__(self, target: Target, pool: Optional[PoolHandle] = None,
                 on_result: Optional[Callable[[CheckResult], None]] = None):
        self.target = target
        self._own_pool = pool is None
        self.pool = pool or PoolHandle(target.nproc)
        if self.pool.nproc != target.nproc:
            raise ValueError(f"pool has {self.pool.nproc} ranks but the target asks for --nproc {target.nproc}")
        self.on_result = on_result
        self.local = LocalContext(target)
        self._bound: dict = {}

    def run(self, checks: Iterable[Check]) -> list[CheckResult]:
        results = []
        for check in checks:
            res = self.run_one(check)
            results.append(res)
            if self.on_result:
                self.on_result(res)
        return results

    def run_one(self, check: Check) -> CheckResult:
        """Run `check` and remember its result (local checks may read earlier results)."""
        res = self._run(check)
        self.local.results[res.id] = res
        return res

    def _run(self, check: Check) -> CheckResult:
        if check.where != "local" and not self.target.load_error:
            self._prepare(check_spec(self.target, check))  # pool start and binding: not the check's time
        t0 = time.perf_counter()
        if check.where == "local":
            status, message, data = run_check_fn(check.fn, self.local, check.params)
            return CheckResult(check.id, check.level, status, message, time.perf_counter() - t0, data)
        if self.target.load_error:
            return CheckResult(check.id, check.level, "skipped", "not run: the plugin did not load "
                               "(see contract.registers)", 0.0)
        if check.where == "all" and self.target.nproc < 2:
            return CheckResult(check.id, check.level, "skipped", f"needs >= 2 ranks, --nproc is "
                               f"{self.target.nproc}", 0.0)
        spec = check_spec(self.target, check)
        ranks = [0] if check.where == "rank0" else None
        try:
            pool = self.pool.get()
            outcomes = pool.run(worker.run_check, spec, check.where, check.fn, check.params,
                                timeout=check.timeout, check=False, ranks=ranks)
        except TimeoutError:
            self.pool.discard()
            return CheckResult(check.id, check.level, "failed", f"did not finish within {check.timeout:g}s "
                               f"(a hang: some call neither returned nor raised); worker pool restarted",
                               time.perf_counter() - t0)
        return self._merge(check, outcomes, time.perf_counter() - t0)

    def _prepare(self, spec) -> None:
        pool = self.pool.get()
        if self._bound.get(id(pool)) == spec:
            return
        try:
            pool.run(worker.prepare, spec, timeout=300, check=False)
        except TimeoutError:
            self.pool.discard()
            return
        self._bound = {id(pool): spec}

    def _merge(self, check: Check, outcomes: list, seconds: float) -> CheckResult:
        per_rank = []
        dead = False
        for o in outcomes:
            if not o.ok:
                dead = dead or o.died
                why = _died(o, self.pool._pool) if o.died else f"worker error {o.error}"
                per_rank.append((o.rank, "failed", why, None))
            else:
                per_rank.append((o.rank, o.value["status"], o.value["message"], o.value["data"]))
        if dead:
            self.pool.discard()
        failed = [(r, m) for r, s, m, _ in per_rank if s == "failed"]
        data = per_rank[0][3] if len(per_rank) == 1 else [d for *_, d in per_rank]
        if failed:
            return CheckResult(check.id, check.level, "failed", _by_rank(failed, len(per_rank)), seconds, data)
        if all(s == "skipped" for _, s, _, _ in per_rank):
            return CheckResult(check.id, check.level, "skipped", per_rank[0][2], seconds, data)
        passed = [(r, m) for r, s, m, _ in per_rank if s == "passed"]
        return CheckResult(check.id, check.level, "passed", _by_rank(passed, len(per_rank)), seconds, data)

    def close(self) -> None:
        if self._own_pool:
            self.pool.close()


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
