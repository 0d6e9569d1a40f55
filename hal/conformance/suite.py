"""The suite: which checks exist for a target, and one call that runs them and builds the report.

    target = load_target("cpu")                       # or load_target("cuda", emulate=True)
    report = run_suite(target, levels=["contract", "ops"], select=["rms_norm"])
    report.summary  # {"passed": ..., "failed": ..., "skipped": ...}

Checks are discovered per level (`hal.conformance.levels.<level>.discover(target)`), in the order of
`LEVELS`; `select` keeps the ids matching any glob (or substring), like pytest -k.
"""
from __future__ import annotations

import importlib
import time
from typing import Callable, Optional, Sequence

from .checks import LEVELS, Check, CheckResult, matches
from .report import Report
from .runner import PoolHandle, Runner
from .target import Target


def discover(target: Target, levels: Sequence[str] = LEVELS, select: Optional[Sequence[str]] = None) -> list[Check]:
    """Every check of `levels` for `target` whose id matches `select` (None: all), in level order."""
    checks: list[Check] = []
    seen: set[str] = set()
    for level in LEVELS:
        if level not in levels:
            continue
        module = importlib.import_module(f"hal.conformance.levels.{level}")
        for check in module.discover(target):
            if check.id in seen:
                raise RuntimeError(f"duplicate check id {check.id!r} in level {level!r}")
            seen.add(check.id)
            if matches(check.id, list(select) if select else None):
                checks.append(check)
    return checks


def run_suite(target: Target, levels: Sequence[str] = LEVELS, select: Optional[Sequence[str]] = None,
              pool: Optional[PoolHandle] = None,
              on_result: Optional[Callable[[CheckResult], None]] = None,
              budgets: Optional[dict[str, float]] = None, bind_timeout_s: Optional[float] = None) -> Report:
    """Discover and run the checks; the report (its `efficiency_matrix` set if perf ran). `budgets`
    (seconds per level) and `bind_timeout_s` override `hal.conformance.bounds`' defaults."""
    t0 = time.perf_counter()
    checks = discover(target, levels, select)
    runner = Runner(target, pool=pool, on_result=on_result, budgets=budgets, bind_timeout_s=bind_timeout_s)
    try:
        results = runner.run(checks)
    finally:
        runner.close()
    return Report.build(target, list(levels), results, time.perf_counter() - t0)
