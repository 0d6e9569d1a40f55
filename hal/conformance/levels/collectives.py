"""Level `collectives`: the chip's own CCL, on every rank of the pool, against golden results.

Check ids: `collectives.<collective>.<dtype>` (non-reducing) and `collectives.<collective>.<dtype>.<op>`
(reducing), for every combination with a defined result (no bitwise ops on floats, no avg of
bools). Each runs at every world size of `Target.world_sizes` (2, 3, 4, --nproc: subgroups of the
pool's first ranks), every size in `SIZES` at the largest (the odd ones below it), a view with a
storage offset and a strided view at every world size, every root of rooted collectives and even and
uneven all_to_all splits, with inputs over the dtype's whole range (`collective_golden`). Each case
also checks that nothing outside the caller's views and no input changed (`collective_calls`). The
capability matrix decides what is asked:

- declared supported: every case must give the golden result (bit-exact for integers, max/min and
  data movement; within the rounding bound for float reductions); strided views may be refused on
  every rank, never written wrong;
- required (`required.REQUIRED_NATIVE`): must be declared;
- not declared: the call must raise `hal.NotSupportedError` on every rank (the hookspec), or give
  the right result (under-declared); another exception or a silent wrong result fails.

Also `collectives.process_group` (the group's rank/size and a barrier),
`collectives.async_wait` (after `work.wait()` returns, the data is there) and
`collectives.semantics.<collective>` for every collective and `barrier` (`collective_semantics`):
what the call promises beyond its output tensor (no rank leaves before a peer it depends on entered;
`is_completed()` and `wait()` tell the truth; in-place all_gather_into_tensor / reduce_scatter_tensor).
"""
from __future__ import annotations

from typing import Callable, Optional

from ..bounds import multi_rank_timeout
from ..checks import Check, CheckFailed
from ..target import Target
from .collective_calls import LAYOUTS
from .collective_golden import ALL_DTYPES, meaningful_ops
from .collective_semantics import COLLECTIVES as SEMANTIC_COLLECTIVES
from .collective_semantics import check_semantics
from .required import REQUIRED_NATIVE, required_by

SIZES = (0, 1, 7, 65539)  # empty, one, odd, large and odd (no even split across ranks)
SMALL_WORLD_SIZES = (7, 65539)  # the sizes run at world sizes below the largest
LAYOUT_SIZE = 7  # also run as a view with a storage offset and as a strided view
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


def _cases(collective: str, dtype: str, op, world: int, sizes=SIZES, layouts=LAYOUTS):
    """Every size (contiguous), layout (a view with a storage offset and a strided view, at
    `LAYOUT_SIZE`), root (rooted collectives: every rank, so roots other than 0 and the last where
    world > 2) and split (all_to_all: even and uneven) of one combination."""
    from .collective_calls import ROOTED, Case
    shapes = [(n, "contiguous") for n in sizes] + [(LAYOUT_SIZE, lay) for lay in layouts if lay != "contiguous"]
    out: list = []
    for n, layout in shapes:
        if collective in ROOTED:
            out.extend(Case(collective, dtype, op, n, root=r, layout=layout) for r in range(world))
        elif collective in ("all_to_all", "all_to_all_single"):
            out.extend(Case(collective, dtype, op, n, uneven=u, layout=layout) for u in (False, True))
        else:
            out.append(Case(collective, dtype, op, n, layout=layout))
    return out


def world_cases(collective: str, dtype: str, op, world: int, largest: int):
    """The cases at one world size: every size at the largest, the odd ones (7 and 65539) below it;
    views with offsets and strides at every world size."""
    return _cases(collective, dtype, op, world, sizes=SIZES if world == largest else SMALL_WORLD_SIZES)


def _attempt(ctx, case, group) -> tuple[bool, str, Optional[BaseException]]:
    """(ok, detail, exception) of one case on this rank: ok=False with what raised or what is wrong."""
    from .collective_calls import run_case
    try:
        outputs = run_case(group, case, ctx.rank, group.size() if hasattr(group, "size") else ctx.world_size,
                           ctx.device)
    except Exception as exc:
        return False, f"raised {type(exc).__name__}: {str(exc).strip()[:300]}", exc
    wrong = [f"{what}: {why}" for what, why in outputs if why]
    return (not wrong), "; ".join(wrong), None


def _typed(exc: Optional[BaseException]) -> bool:
    from hal.contract.errors import NotSupportedError
    return isinstance(exc, NotSupportedError)


def run_cases(ctx, cases, group, world: int, refusal_ok: Callable) -> tuple[int, list[str]]:
    """Run `cases` on `group` (None on ranks outside it: they only join the agreement), then agree
    once over every rank. A case that raised where `refusal_ok(case, exc)` accepts it (a refusal on
    every rank, e.g. NCCL's of strided views) is noted and the next case runs; any other raise stops
    this rank (its peers stop when their call times out) and a wrong result is kept while the rest
    run, so the first problem is reported. Raises CheckFailed naming the world size and the case.
    Returns (cases that ran correctly, notes on accepted refusals). After any refusal the groups are
    rebuilt: a refusal on some ranks only may have left the others out of step."""
    member = group is not None
    done, notes, bad = 0, [], None
    for case in cases if member else ():
        ok, detail, exc = _attempt(ctx, case, group)
        if exc is not None and refusal_ok(case, exc):
            notes.append(f"{case.describe()} (world {world}): {detail[len('raised '):][:120]}")
            continue
        if not ok:
            bad = bad or f"world size {world}, {case.describe()}: {detail}"
            if exc is not None:
                break
            continue
        done += 1
    flags = ctx.agree_max([1.0 if bad else 0.0, 1.0 if notes else 0.0])
    if flags[1] or flags[0]:
        ctx.drop_ccl()
    if bad:
        raise CheckFailed(bad)
    if flags[0]:
        raise CheckFailed(f"world size {world}: every case was right on this rank but wrong or refused on another")
    return done, notes


def check_collective(ctx, collective: str, dtype: str, op, world_sizes=(2,)) -> str:
    caps = ctx.acc.capabilities
    declared = caps.supports(collective, dtype, op)
    label = f"{collective} dtype={dtype}" + (f" op={op}" if op else "")
    need = required_by(REQUIRED_NATIVE, collective, dtype, op)
    if need and not declared:
        raise CheckFailed(f"required of every chip's CCL ({need} issues {label}), but the capability matrix does "
                          f"not declare it (a refusal is not a pass)")
    if declared:
        total, notes = 0, list[str]()
        for w in world_sizes:
            group = ctx.ccl(w)
            cases = world_cases(collective, dtype, op, w, max(world_sizes))
            _, more = run_cases(ctx, cases, group, w, refusal_ok=lambda case, exc: case.optional)
            total, notes = total + len(cases) - len(more), notes + more
        note = (f"; optional cases refused: {notes[0]}" + (f" (+{len(notes) - 1} more)" if len(notes) > 1 else "")
                if notes else "")
        return (f"declared supported{' (required: ' + need + ')' if need else ''}: {total} cases correct at world "
                f"sizes {list(world_sizes)} (sizes {list(SIZES)}, offset and strided views of {LAYOUT_SIZE})"
                f"{note}")
    case = _cases(collective, dtype, op, ctx.world_size, sizes=(7,), layouts=("contiguous",))[0]
    ok, detail, exc = _attempt(ctx, case, ctx.ccl())
    typed = _typed(exc)
    flags = ctx.agree_max([1.0 if typed else 0.0, 0.0 if typed else 1.0, 1.0 if ok else 0.0, 0.0 if ok else 1.0])
    if flags[2] and not flags[3]:
        return f"not declared, yet correct ({case.describe()}): the capability matrix under-declares"
    if typed and not flags[1]:
        return f"not declared, refused as the hookspec asks: {detail[len('raised '):]}"
    if exc is not None and not typed:
        raise CheckFailed(f"not declared; an undeclared combination must raise hal.NotSupportedError (the hookspec "
                          f"of hal_collective_capabilities) or give the right result; {label} {detail}")
    if exc is not None:
        raise CheckFailed(f"not declared; expected every rank to refuse {label} with hal.NotSupportedError, but "
                          f"this rank raised and another did not: {detail}")
    if not ok:
        raise CheckFailed(f"not declared in the capability matrix, so {label} must raise hal.NotSupportedError or "
                          f"give the right result; it returned without error and a wrong result: {detail}")
    raise CheckFailed(f"not declared; right on this rank but refused or wrong on another ({case.describe()})")


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
    """The group checks, one check a combination of collective x dtype x reduce op, then the barrier;
    every one on all ranks, bounded by the group's timeout."""
    t = multi_rank_timeout(target.group_timeout_s)
    rows: list[tuple[str, str, Callable, tuple]] = [
        ("process_group", "the chip's CCL group reports its rank and size and completes a barrier",
         check_process_group, ()),
        ("async_wait", "after an async collective's work.wait() returns, the output holds the result",
         check_async_wait, ())]
    for suffix, coll, d, op in combinations():
        what = (f"{coll} of {d} with {op}: golden result if declared, refusal if not" if op else
                f"{coll} of {d}: bit-exact if declared, refusal if not")
        rows.append((suffix, what, check_collective, (coll, d, op, target.world_sizes)))
    rows.append(("barrier", "barrier completes on every rank", check_barrier, ()))
    for coll in SEMANTIC_COLLECTIVES:
        rows.append((f"semantics.{coll}", f"{coll}: no bound rank leaves before a delayed peer entered; is_completed() "
                     f"and wait() tell the truth" + ("; in place as FSDP2 issues it" if coll in
                                                    ("all_gather_into_tensor", "reduce_scatter_tensor") else ""),
                     check_semantics, (coll,)))
    return [Check(f"collectives.{name}", "collectives", doc, fn, params, where="all", timeout=t)
            for name, doc, fn, params in rows]


def check_barrier(ctx) -> str:
    pg = ctx.ccl()
    for _ in range(3):
        pg.barrier().wait()
    return "3 barriers completed"
