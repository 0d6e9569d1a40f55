"""Level `collectives`: the chip's own CCL, on every rank of the pool, against golden results.

Check ids: `collectives.<collective>.<dtype>` (non-reducing) and `collectives.<collective>.<dtype>.<op>`
(reducing), for every combination with a defined result (no bitwise ops on floats, no avg of
bools). Each runs every size in `SIZES` (empty, one, odd, large) and, for rooted collectives, every
root; all_to_all(_single) runs even and uneven splits. The capability matrix decides what is asked:

- declared supported: every case must give the golden result (bit-exact for integers, max/min and
  data movement; within the rounding bound for float reductions, see `collective_golden`);
- not declared: the call must be refused (raise on every rank, e.g. `hal.NotSupportedError`), or
  give the right result (the bridge emulates it); a silent wrong result fails.

Also `collectives.process_group` (the group's rank/size and a barrier) and
`collectives.async_wait` (after `work.wait()` returns, the data is there).
"""
from __future__ import annotations

from ..checks import Check, CheckFailed
from ..target import Target
from .collective_golden import ALL_DTYPES, meaningful_ops

SIZES = (0, 1, 7, 65539)  # empty, one, odd, large and odd (no even split across ranks)
REDUCING = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor")
MOVING = ("broadcast", "all_gather", "all_gather_into_tensor", "all_to_all", "all_to_all_single", "gather",
          "scatter", "send_recv")


def combinations():
    """(check-id suffix, collective, dtype, reduce op or None) for every collective the suite checks:
    reducing ones with each reduce op that is meaningful for the dtype, data-moving ones once."""
    for coll in REDUCING:
        for d in ALL_DTYPES:
            for op in meaningful_ops(d):
                yield f"{coll}.{d}.{op}", coll, d, op
    for coll in MOVING:
        for d in ALL_DTYPES:
            yield f"{coll}.{d}", coll, d, None


def _cases(collective: str, dtype: str, op, world: int, sizes=SIZES):
    from .collective_calls import ROOTED, Case
    out = []
    for n in sizes:
        if collective in ROOTED:
            out.extend(Case(collective, dtype, op, n, root=r) for r in range(world))
        elif collective in ("all_to_all", "all_to_all_single"):
            out.extend(Case(collective, dtype, op, n, uneven=u) for u in (False, True))
        else:
            out.append(Case(collective, dtype, op, n))
    return out


def _attempt(ctx, case, group=None) -> tuple[bool, str]:
    """(ok, detail) of one case on this rank; ok=False with the exception or the wrong output."""
    from .collective_calls import run_case
    try:
        outputs = run_case(group if group is not None else ctx.ccl(), case, ctx.rank, ctx.world_size, ctx.device)
    except Exception as exc:
        return False, f"raised {type(exc).__name__}: {str(exc).strip()[:300]}"
    wrong = [f"{what}: {why}" for what, why in outputs if why]
    return (not wrong), "; ".join(wrong)


def check_collective(ctx, collective: str, dtype: str, op) -> str:
    caps = ctx.acc.capabilities
    declared = caps.supports(collective, dtype, op)
    label = f"{collective} dtype={dtype}" + (f" op={op}" if op else "")
    if declared:
        return _declared(ctx, _cases(collective, dtype, op, ctx.world_size))
    case = _cases(collective, dtype, op, ctx.world_size, sizes=(7,))[0]
    ok, detail = _attempt(ctx, case)
    raised = detail.startswith("raised ")
    flags = ctx.agree_max([1.0 if raised else 0.0, 0.0 if raised else 1.0])
    if ok:
        return f"not declared, yet correct ({case.describe()}): the capability matrix under-declares"
    if raised and flags[1] == 0.0:
        return f"not declared, refused as expected: {detail[len('raised '):]}"
    if raised:
        raise CheckFailed(f"not declared; expected every rank to refuse {label} (or give the right result), "
                          f"but this rank raised and another did not: {detail}")
    raise CheckFailed(f"not declared in the capability matrix, so {label} must raise a not-supported error or "
                      f"give the right result; it returned without error and a wrong result: {detail}")


def _declared(ctx, cases) -> str:
    """Run every case of a declared combination; fail on the first wrong one.

    Ranks stay in step without a handshake per case: a wrong *result* does not stop a rank (every
    rank runs every case, then they agree once); a case that *raised* stops this rank at once and
    it agrees right away, and a peer still inside a collective reaches the same agreement when its
    group times out and raises. Optional cases (see `Case.optional`) may be refused; they agree
    per case, since a refusal on some ranks only would leave the others mid-call."""
    first_wrong, refused = None, []
    raised_at = None
    for case in cases:
        ok, detail = _attempt(ctx, case)
        raised = detail.startswith("raised ")
        if case.optional:
            flags = ctx.agree_max([1.0 if raised else 0.0, 0.0 if ok or raised else 1.0])
            if not ok and not raised and first_wrong is None:
                first_wrong = (case, detail)
            if flags[0] > 0:
                refused.append(f"{case.describe()} refused ({detail[len('raised '):][:120]})" if raised
                               else f"{case.describe()} refused on another rank")
                if not raised:
                    ctx.drop_ccl()  # this rank completed a call its peers refused: rebuild the group
            continue
        if raised:
            raised_at = (case, detail)
            break
        if not ok and first_wrong is None:
            first_wrong = (case, detail)
    bad = first_wrong or raised_at
    others_bad = ctx.agree_max([1.0 if bad else 0.0])[0] > 0
    if bad:
        case, detail = bad
        raise CheckFailed(f"declared supported in the capability matrix; expected the golden result, "
                          f"{case.describe()}: {detail}")
    if others_bad:
        raise CheckFailed("declared supported; every case was right on this rank but failed on another")
    note = (f"; optional cases refused: {refused[0]}" + (f" (+{len(refused) - 1} more)" if len(refused) > 1 else "")
            if refused else "")
    return f"declared supported: {len(cases) - len(refused)} cases correct (sizes {list(SIZES)}){note}"


def check_process_group(ctx) -> str:
    pg = ctx.ccl()
    got = []
    for name, want in (("rank", ctx.rank), ("size", ctx.world_size)):
        fn = getattr(pg, name, None)
        if callable(fn):
            value = fn()
            if value != want:
                raise CheckFailed(f"group.{name}() returned {value}, expected {want}")
            got.append(f"{name}()={value}")
    pg.barrier().wait()
    return f"{type(pg).__name__}: {', '.join(got)}; barrier completed"


def check_async_wait(ctx) -> str:
    """Large async collectives, read immediately after wait(): the data must already be there."""
    import torch
    import torch.distributed as dist
    pg, n, world, rank = ctx.ccl(), 1 << 20, ctx.world_size, ctx.rank
    dev = ctx.device
    t = torch.full((n,), float(rank + 1), device=dev)
    work = pg.allreduce([t], dist.AllreduceOptions())
    work.wait()
    want = world * (world + 1) / 2
    got = t[-1].item(), t[0].item()
    if got != (want, want):
        raise CheckFailed(f"all_reduce of {n} float32: after work.wait() returned, element [-1] is {got[0]} and [0] "
                          f"is {got[1]}, expected {want}: wait() returned before the collective finished")
    out = torch.zeros(n * world, device=dev)
    pg._allgather_base(out, torch.full((n,), float(rank + 1), device=dev)).wait()
    firsts = [out[r * n + n - 1].item() for r in range(world)]
    if firsts != [float(r + 1) for r in range(world)]:
        raise CheckFailed(f"all_gather_into_tensor of {n} float32 per rank: after wait(), the last element of each "
                          f"rank's chunk is {firsts}, expected {[float(r + 1) for r in range(world)]}")
    return f"all_reduce and all_gather_into_tensor of {n} float32: complete when wait() returns"


def discover(target: Target) -> list[Check]:
    t = max(60.0, 2 * target.group_timeout_s + 30)
    checks = [
        Check("collectives.process_group", "collectives",
              "the chip's CCL group reports its rank and size and completes a barrier",
              check_process_group, where="all", timeout=t),
        Check("collectives.async_wait", "collectives",
              "after an async collective's work.wait() returns, the output holds the result",
              check_async_wait, where="all", timeout=t),
    ]
    for suffix, coll, d, op in combinations():
        what = (f"{coll} of {d} with {op}: golden result if declared, refusal if not" if op else
                f"{coll} of {d}: bit-exact if declared, refusal if not")
        checks.append(Check(f"collectives.{suffix}", "collectives", what, check_collective, (coll, d, op),
                            where="all", timeout=t))
    checks.append(Check("collectives.barrier", "collectives", "barrier completes on every rank",
                        check_barrier, where="all", timeout=t))
    return checks


def check_barrier(ctx) -> str:
    pg = ctx.ccl()
    for _ in range(3):
        pg.barrier().wait()
    return "3 barriers completed"
