"""Level `bridge`: the plugin's chip and the `cpu` reference chip in one `hetero` cluster (ccl_bridge).

The pool's ranks are split: the first half bind the plugin's chip (emulated if the run is), the
rest bind `cpu`; a `hetero` group spans them (built through `hal.ccl_bridge.create`, the backend's
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

from ..bounds import multi_rank_timeout
from ..checks import Check, CheckFailed, CheckNotApplicable, CheckSkipped
from ..target import Target, WorkerSpec
from .collectives import SIZES, _cases, _typed, combinations, run_cases
from .required import REQUIRED_BRIDGE, required_by


def bridge_spec(target: Target) -> WorkerSpec:
    """The bridge's ranks: at least 2 of the plugin's chip (so its own CCL carries the intra-chip
    part: with one rank per chip the bridge would never call it) and at least 1 of `cpu`; --nproc
    ranks when that is 3 or more (the first half, rounded up, on the chip), else 3."""
    n = max(target.nproc, 3)
    k = max(2, (n + 1) // 2)
    plugins = (target.plugin,) if target.chip == "cpu" else (target.plugin, "cpu")
    return WorkerSpec(plugins=plugins, chip=target.chip, emulated=target.emulated, seed=target.seed,
                      group_timeout_s=target.group_timeout_s, chips=tuple([target.chip] * k + ["cpu"] * (n - k)))


def _available() -> tuple[bool, str]:
    if importlib.util.find_spec("hal.ccl_bridge") is None:
        return False, "ccl_bridge not available"
    try:
        from hal import ccl_bridge
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
        raise CheckNotApplicable("the plugin's chip is the cpu reference: there is no second chip kind to bridge to")
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
    need = required_by(REQUIRED_BRIDGE, collective, dtype, op)

    def refusal_ok(case, exc) -> bool:
        # Typed refusals only, and never of what training issues (strided views excepted: training
        # hands the CCL contiguous buffers, and NCCL itself refuses strided ones).
        return _typed(exc) and (need is None or case.layout == "strided")

    cases = _cases(collective, dtype, op, ctx.world_size)
    try:
        _, notes = run_cases(ctx, cases, group, ctx.world_size, refusal_ok)
    except CheckFailed as exc:
        if need:
            raise CheckFailed(f"required ({need} issues it), so a refusal is not a pass: {exc}") from None
        raise
    done = len(cases) - len(notes)
    tag = f" (required: {need})" if need else ""
    if done == 0 and notes:
        return f"refused with hal.NotSupportedError{tag}: {notes[0]}"
    note = f"; refused: {notes[0]}" + (f" (+{len(notes) - 1} more)" if len(notes) > 1 else "") if notes else ""
    return (f"{done} cases correct across the chips{tag} (sizes {list(SIZES)}, offset and strided views; "
            f"{ctx.world_size} ranks, {ctx.spec.chips.count(ctx.spec.chip)} on {ctx.spec.chip}){note}")


def _skipped(ctx, why: str, applicable: bool = True) -> str:
    raise (CheckSkipped if applicable else CheckNotApplicable)(why)


# the runner reads a check's `worker_spec` attribute (getattr) to build its worker processes
check_hetero_group.worker_spec = bridge_spec  # type: ignore[attr-defined]
check_bridge_collective.worker_spec = bridge_spec  # type: ignore[attr-defined]


def discover(target: Target) -> list[Check]:
    t = multi_rank_timeout(target.group_timeout_s)
    doc = "the plugin's chip and cpu form one hetero group"
    available, why = _available()
    if target.chip == "cpu" or not available:
        # Skipped with the reason, decided here (no worker pool); the combinations are not listed.
        applicable = target.chip != "cpu"
        why = why if applicable else "the plugin's chip is the cpu reference: there is no second chip kind to bridge to"
        return [Check("bridge.hetero_group", "bridge", doc, _skipped, (why, applicable), where="local")]
    checks = [Check("bridge.hetero_group", "bridge", doc, check_hetero_group, where="all", timeout=t)]
    for suffix, coll, d, op in combinations():
        what = (f"{coll} of {d} with {op} across chips: golden result or typed refusal" if op else
                f"{coll} of {d} across chips: bit-exact or typed refusal")
        checks.append(Check(f"bridge.{suffix}", "bridge", what, check_bridge_collective, (coll, d, op),
                            where="all", timeout=t))
    return checks
