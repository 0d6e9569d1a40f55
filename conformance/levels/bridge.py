"""Level `bridge`: the plugin's chip and the `cpu` reference chip in one `hetero` cluster (ccl_bridge).

The pool's ranks are split: the first half bind the plugin's chip (emulated if the run is), the
rest bind `cpu`; a `hetero` group spans them (built through `ccl_bridge.create`, the backend's
creator). Check ids: `bridge.hetero_group` (the group forms and spans both chips), then
`bridge.<collective>.<dtype>[.<op>]` over the same combinations as the collectives level, each case
against the same golden results. The bridge emulates what a chip's CCL lacks, so every combination
must give the golden result, or be refused on every rank with `hal.NotSupportedError` (the typed
refusal the bridge promises, e.g. AVG of integers); any other outcome fails. Skipped with
"ccl_bridge not available" when the package is missing or has no `hetero` backend, and when the
plugin's chip is `cpu` itself (no second chip kind to bridge to); then only `bridge.hetero_group`
is listed (skipped, with the reason).
"""
from __future__ import annotations

import importlib.util

from ..checks import Check, CheckFailed, CheckSkipped
from ..target import Target, WorkerSpec
from .collectives import SIZES, _attempt, _cases, combinations


def bridge_spec(target: Target) -> WorkerSpec:
    n = target.nproc
    k = (n + 1) // 2
    plugins = (target.plugin,) if target.chip == "cpu" else (target.plugin, "cpu")
    return WorkerSpec(plugins=plugins, chip=target.chip, emulated=target.emulated, seed=target.seed,
                      group_timeout_s=target.group_timeout_s, chips=tuple([target.chip] * k + ["cpu"] * (n - k)))


def _available() -> tuple[bool, str]:
    if importlib.util.find_spec("ccl_bridge") is None:
        return False, "ccl_bridge not available"
    try:
        import ccl_bridge
    except Exception as exc:
        return False, f"ccl_bridge not available (import failed: {type(exc).__name__}: {exc})"
    if not callable(getattr(ccl_bridge, "create", None)):
        return False, "ccl_bridge not available (no `create` backend creator)"
    return True, ""


def _skip_reason(ctx) -> str:
    ok, why = _available()
    if not ok:
        return why
    if ctx.spec.chip == "cpu":
        return "the plugin's chip is the cpu reference: there is no second chip kind to bridge to"
    return ""


def check_hetero_group(ctx) -> str:
    why = _skip_reason(ctx)
    if why:
        raise CheckSkipped(why)
    pg = ctx.hetero()
    name = type(pg).__name__
    describe = getattr(pg, "describe", None)
    info = describe() if callable(describe) else {}
    if name != "HeteroProcessGroup":
        raise CheckFailed(f"expected a HeteroProcessGroup spanning chips {sorted(set(ctx.spec.chips))}, got {name} "
                          f"(the bridge saw one chip kind)")
    pg.barrier().wait()
    chips = sorted({c for c in ctx.spec.chips})
    return f"HeteroProcessGroup over {ctx.world_size} ranks, chips {chips}; barrier completed" + (
        f"; {info.get('topology', '')}" if isinstance(info, dict) and info.get("topology") else "")


def check_bridge_collective(ctx, collective: str, dtype: str, op) -> str:
    why = _skip_reason(ctx)
    if why:
        raise CheckSkipped(why)
    group = ctx.hetero()
    cases = _cases(collective, dtype, op, ctx.world_size)
    first_bad, refused = None, None
    for case in cases:
        ok, detail = _attempt(ctx, case, group)
        if detail.startswith("raised NotSupportedError"):
            refused = (case, detail)
            break
        if detail.startswith("raised "):
            first_bad = (case, detail)
            break
        if not ok and first_bad is None:
            first_bad = (case, detail)
    flags = ctx.agree_max([1.0 if first_bad else 0.0, 1.0 if refused else 0.0, 0.0 if refused else 1.0])
    if first_bad:
        case, detail = first_bad
        raise CheckFailed(f"expected the golden result (or hal.NotSupportedError on every rank), "
                          f"{case.describe()} on the hetero group: {detail}")
    if flags[0] > 0:
        raise CheckFailed("every case was right on this rank but failed on another")
    if refused and flags[2] > 0:
        raise CheckFailed(f"{refused[0].describe()} was refused on this rank but not on another: {refused[1]}")
    if refused:
        return f"refused with a typed error: {refused[1][len('raised '):][:200]}"
    return f"{len(cases)} cases correct across the chips (sizes {list(SIZES)})"


def _skipped(ctx, why: str) -> str:
    raise CheckSkipped(why)


check_hetero_group.worker_spec = bridge_spec
check_bridge_collective.worker_spec = bridge_spec


def discover(target: Target) -> list[Check]:
    t = max(60.0, 2 * target.group_timeout_s + 30)
    doc = "the plugin's chip and cpu form one hetero group"
    available, why = _available()
    if target.chip == "cpu" or not available:
        # Skipped with the reason, decided here (no worker pool); the combinations are not listed.
        why = why or "the plugin's chip is the cpu reference: there is no second chip kind to bridge to"
        return [Check("bridge.hetero_group", "bridge", doc, _skipped, (why,), where="local")]
    checks = [Check("bridge.hetero_group", "bridge", doc, check_hetero_group, where="all", timeout=t)]
    for suffix, coll, d, op in combinations():
        what = (f"{coll} of {d} with {op} across chips: golden result or typed refusal" if op else
                f"{coll} of {d} across chips: bit-exact or typed refusal")
        checks.append(Check(f"bridge.{suffix}", "bridge", what, check_bridge_collective, (coll, d, op),
                            where="all", timeout=t))
    return checks
