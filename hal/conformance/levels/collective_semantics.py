"""What a collective promises beyond its output tensor: `collectives.semantics.<collective>`.

A collective that returns at once without doing what it promises the other ranks can leave every
tensor result looking right (the golden checks read the output after every rank has entered). One
check per collective (and `barrier`), each one call of float32 at the pool's world size, checks:

- **ordering**: one rank (`delayed`) waits until every other rank said (on the suite's control
  group) that it is entering, then sleeps `DELAY_S` before it enters; a rank whose completion
  depends on it may not leave (`work.wait()` and the device's `synchronize()` returned) before the
  delayed rank entered. Every rank records wall-clock (`time.time()`) enter and leave times; they are
  exchanged over the suite's control group. Which ranks are bound follows torch's documented
  semantics: `barrier` blocks every rank until the whole group entered; all_reduce, all_gather(_into_
  tensor), reduce_scatter(_tensor) and all_to_all(_single) give every rank data from every rank;
  broadcast and scatter bind the non-roots to the root (the root may leave once its data is sent, as
  NCCL's may); reduce and gather bind the root to every rank (non-roots may leave early); send/recv
  binds the receiver to the sender. The delayed rank is one a bound rank waits for (the root of
  broadcast/scatter, the last rank otherwise).
- **completion**: after `wait()` and `synchronize()`, `work.is_completed()` is True (for
  reduce_scatter(_tensor) a False is noted, not failed: torch 2.13's own gloo never marks those works
  completed, and a False makes no caller read early) and the output holds the result; if
  `is_completed()` says True before `wait()` (queried right after the call), the output read then
  already holds the result (torch: the output "can be utilized ... without further synchronization").
- **in place**: all_gather_into_tensor with the input being this rank's chunk of the output, and
  reduce_scatter_tensor with the output being this rank's chunk of the input (what FSDP2 issues;
  NCCL documents both as in-place operation) give the same result as out of place.

The margin: `MARGIN_S` = 0.05 s. The ranks of the pool share one host and so one clock, and a
correct call's recorded leave time (taken after it returned) can never precede the delayed rank's
recorded enter time (taken before it called), so no margin is needed for a correct plugin; 0.05 s
absorbs a step of the wall clock between two reads and timer granularity, and is a quarter of
`DELAY_S`, so a rank that left without waiting (at most a few ms after the others entered, against
0.2 s) still fails by far.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from ..checks import CheckFailed, CheckNotApplicable, CheckSkipped

DELAY_S = 0.2  # the delayed rank sleeps this long before it enters
MARGIN_S = 0.05  # a bound rank fails if it left more than this before the delayed rank entered
N = 1024  # float32 elements per rank
_ENTERING_TAG = 0x5EA  # control-group tag: "this rank is entering the call"
COLLECTIVES = ("barrier", "all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor", "broadcast",
               "all_gather", "all_gather_into_tensor", "all_to_all", "all_to_all_single", "gather", "scatter",
               "send_recv")
_REDUCING = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor")
_TO_ROOT = ("reduce", "gather")  # the root waits for everyone; non-roots may leave early
_FROM_ROOT = ("broadcast", "scatter")  # non-roots wait for the root; the root may leave early

Verify = Callable[[], Optional[str]]
_STALE = "work.is_completed() is False after wait() and synchronize() returned"
# torch 2.13's own ProcessGroupGloo never marks these works completed (is_completed() stays False
# after wait()): conservative, it makes no caller read early, so it is noted, not failed
_STALE_OK = ("reduce_scatter", "reduce_scatter_tensor")


def plan(collective: str, world: int) -> tuple[int, int, list[int]]:
    """(root, delayed rank, ranks that may not leave before the delayed rank entered)."""
    last = world - 1
    if collective in _FROM_ROOT:
        return last, last, list(range(last))
    if collective in _TO_ROOT:
        return 0, last, [0]
    if collective == "send_recv":  # a ring: rank 0 receives from the last rank
        return 0, last, [0]
    return 0, last, list(range(last))


def _x(r: int, m: int, device: Any) -> torch.Tensor:
    """Rank r's input of m elements: distinct per rank and per element, exact in float32."""
    return ((r + 1) * 1000 + torch.arange(m, dtype=torch.float32)).to(device)


def _differs(what: str, got: torch.Tensor, want: torch.Tensor) -> Optional[str]:
    g, w = got.detach().to("cpu"), want.detach().to("cpu")
    if g.shape == w.shape and torch.equal(g, w):
        return None
    bad = (g != w).nonzero() if g.shape == w.shape else None
    if bad is None or not bad.numel():
        return f"{what}: shape {tuple(g.shape)}, expected {tuple(w.shape)}"
    i = int(bad[0][0])
    return f"{what}: {bad.shape[0]} of {w.numel()} elements wrong, first [{i}] = {g[i].item()}, expected {w[i].item()}"


def _opts(cls, **fields):
    o = cls()
    for k, v in fields.items():
        setattr(o, k, v)
    return o


def _issue(collective: str, pg: Any, rank: int, world: int, root: int, dev: Any) -> tuple[Any, Verify]:
    """Post the collective (async) on this rank; (work, a function saying what is wrong with the output)."""
    x, n = (lambda r, m=N: _x(r, m, dev)), N
    total = sum(x(r) for r in range(world)) if collective in _REDUCING else None
    if collective == "barrier":
        return pg.barrier(), lambda: None
    if collective in ("all_reduce", "reduce"):
        t = x(rank)
        if collective == "all_reduce":
            return pg.allreduce([t], _opts(dist.AllreduceOptions, reduceOp=dist.ReduceOp.SUM)), \
                lambda: _differs("output", t, total)
        work = pg.reduce([t], _opts(dist.ReduceOptions, reduceOp=dist.ReduceOp.SUM, rootRank=root))
        return work, (lambda: _differs("root output", t, total)) if rank == root else (lambda: None)
    if collective in ("reduce_scatter", "reduce_scatter_tensor"):
        out, inp = torch.zeros(n, device=dev), x(rank, n * world)
        want = sum(x(r, n * world)[rank * n:(rank + 1) * n] for r in range(world))
        o = _opts(dist.ReduceScatterOptions, reduceOp=dist.ReduceOp.SUM)
        work = (pg.reduce_scatter([out], [list(inp.split(n))], o) if collective == "reduce_scatter" else
                pg._reduce_scatter_base(out, inp, o))
        return work, lambda: _differs("output", out, want)
    if collective in ("broadcast", "scatter"):
        if collective == "broadcast":
            t = x(rank)
            work = pg.broadcast([t], _opts(dist.BroadcastOptions, rootRank=root))
            return work, lambda: _differs("output", t, x(root))
        out = torch.zeros(n, device=dev)
        ins = [[x(r) for r in range(world)]] if rank == root else []
        work = pg.scatter([out], ins, _opts(dist.ScatterOptions, rootRank=root))
        return work, lambda: _differs("output", out, x(rank))
    return _issue_gathering(collective, pg, rank, world, root, dev)


def _issue_gathering(collective: str, pg: Any, rank: int, world: int, root: int, dev: Any) -> tuple[Any, Verify]:
    x, n = (lambda r, m=N: _x(r, m, dev)), N
    if collective == "all_gather":
        outs = [torch.zeros(n, device=dev) for _ in range(world)]
        everyone = torch.cat([x(r) for r in range(world)])
        return pg.allgather([outs], [x(rank)]), lambda: _differs("output", torch.cat(outs), everyone)
    if collective == "all_gather_into_tensor":
        out = torch.zeros(n * world, device=dev)
        everyone = torch.cat([x(r) for r in range(world)])
        return pg._allgather_base(out, x(rank)), lambda: _differs("output", out, everyone)
    if collective in ("all_to_all", "all_to_all_single"):
        want = torch.cat([x(r, n * world)[rank * n:(rank + 1) * n] for r in range(world)])
        if collective == "all_to_all_single":
            out = torch.zeros(n * world, device=dev)
            return (pg.alltoall_base(out, x(rank, n * world), [n] * world, [n] * world, dist.AllToAllOptions()),
                    lambda: _differs("output", out, want))
        outs = [torch.zeros(n, device=dev) for _ in range(world)]
        return (pg.alltoall(outs, list(x(rank, n * world).split(n)), dist.AllToAllOptions()),
                lambda: _differs("output", torch.cat(outs), want))
    if collective == "gather":
        outs = [[torch.zeros(n, device=dev) for _ in range(world)]] if rank == root else []
        work = pg.gather(outs, [x(rank)], _opts(dist.GatherOptions, rootRank=root))
        if rank != root:
            return work, lambda: None
        return work, lambda: _differs("root output", torch.cat(outs[0]), torch.cat([x(r) for r in range(world)]))
    if collective == "send_recv":
        out = torch.zeros(n, device=dev)
        src, dst = (rank - 1) % world, (rank + 1) % world
        return _Both(pg.send([x(rank)], dst, 11), pg.recv([out], src, 11)), lambda: _differs(
            f"received from rank {src}", out, x(src))
    raise ValueError(f"unknown collective {collective!r}")


class _Both:
    """The send and the recv of one rank as one work: complete when both are."""

    def __init__(self, send: Any, recv: Any) -> None:
        self.works = (recv, send)

    def wait(self) -> bool:
        for w in self.works:
            w.wait()
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self.works)


def _supported(ctx, collective: str) -> None:
    if ctx.world_size < 2:
        raise CheckSkipped("one rank: no peer to order against (run with --nproc 2 or more)")
    if collective == "barrier":
        return
    op = "sum" if collective in _REDUCING else None
    if not ctx.acc.capabilities.supports(collective, "float32", op):
        raise CheckNotApplicable(f"{collective} of float32{' with sum' if op else ''} is not declared supported "
                                 f"(its refusal is checked by collectives.{collective}.float32)")


def _timed_call(ctx, collective: str, root: int, delayed: int) -> tuple[float, float, list[str]]:
    """Issue the call: (enter, leave, problems on this rank). The delayed rank waits until every other
    rank said (on the control group) that it is entering, then `DELAY_S` more: so every other rank
    entered at least `DELAY_S` before it, however the host schedules the ranks."""
    pg, rank, world, control = ctx.ccl(), ctx.rank, ctx.world_size, ctx.control()
    ctx.agree_max([0.0])  # line the ranks up on the control group
    said = None
    if rank == delayed:
        for r in range(world):
            if r != delayed:
                control.recv([torch.zeros(1)], r, _ENTERING_TAG).wait()
        time.sleep(DELAY_S)
    enter = time.time()
    if rank != delayed:
        said = control.send([torch.ones(1)], delayed, _ENTERING_TAG)
    try:
        return enter, *_complete(ctx, *_issue(collective, pg, rank, world, root, ctx.device))
    except Exception as exc:  # the peers still meet this rank at the exchange of times
        return enter, float("inf"), [f"raised {type(exc).__name__}: {str(exc).strip()[:300]}"]
    finally:
        if said is not None:
            said.wait()


def _complete(ctx, work: Any, verify: Verify) -> tuple[float, list[str]]:
    """Query is_completed(), wait, synchronize: (leave time, problems on this rank)."""
    problems = []
    if work.is_completed():
        early = verify()
        if early:
            problems.append(f"work.is_completed() was True right after the call (before wait()), but the output "
                            f"read then was not the result: {early}")
    work.wait()
    ctx.acc.synchronize()
    leave = time.time()
    if not work.is_completed():
        problems.append(_STALE)
    late = verify()
    if late:
        problems.append(f"after wait() and synchronize() returned, the output is not the result: {late}")
    return leave, problems


def check_semantics(ctx, collective: str) -> str:
    """Ordering, completion and in-place semantics of one collective (see the module's docstring)."""
    _supported(ctx, collective)
    world, rank = ctx.world_size, ctx.rank
    root, delayed, bound = plan(collective, world)
    enter, leave, problems = _timed_call(ctx, collective, root, delayed)
    stamps = [float("-inf")] * (2 * world)
    stamps[rank], stamps[world + rank] = enter, leave
    stamps = ctx.agree_max(stamps)
    t0 = min(stamps[:world])
    enters, leaves = [t - t0 for t in stamps[:world]], [t - t0 for t in stamps[world:]]
    early = [r for r in bound if leaves[r] < enters[delayed] - MARGIN_S]
    if early:
        r = early[0]
        raise CheckFailed(
            f"{collective} (world {world}{f', root {root}' if collective in _TO_ROOT + _FROM_ROOT else ''}): "
            f"rank {r} left (wait() and synchronize() returned) at +{leaves[r]:.3f} s, before rank {delayed} "
            f"entered at +{enters[delayed]:.3f} s (it was delayed {DELAY_S} s; margin {MARGIN_S} s); rank {r} "
            f"cannot complete before rank {delayed} entered: the call returned without waiting for its peers"
            + (f" (also ranks {early[1:]})" if len(early) > 1 else ""))
    stale = _STALE in problems and collective in _STALE_OK
    problems = [p for p in problems if not (stale and p == _STALE)]
    if problems:
        raise CheckFailed(f"{collective} (world {world}) on rank {rank}: " + "; ".join(problems))
    inplace = _in_place(ctx, collective)
    return (f"{collective} (world {world}): ranks {bound} left after rank {delayed} entered (delayed {DELAY_S} s, "
            f"latest bound leave +{max(leaves[r] for r in bound):.3f} s vs enter +{enters[delayed]:.3f} s, "
            f"margin {MARGIN_S} s); " + ("is_completed() stayed False after wait() (as torch's gloo reduce_scatter's "
                                         "does: conservative, noted)" if stale else "is_completed() True after wait()")
            + ", data there" + inplace)


def _in_place(ctx, collective: str) -> str:
    """all_gather_into_tensor / reduce_scatter_tensor with the input and output aliased as FSDP2 issues them."""
    if collective not in ("all_gather_into_tensor", "reduce_scatter_tensor"):
        return ""
    pg, rank, world, dev, n = ctx.ccl(), ctx.rank, ctx.world_size, ctx.device, N
    if collective == "all_gather_into_tensor":
        out = torch.zeros(n * world, device=dev)
        out[rank * n:(rank + 1) * n] = _x(rank, n, dev)
        pg._allgather_base(out, out[rank * n:(rank + 1) * n]).wait()
        ctx.acc.synchronize()
        bad = _differs("output", out, torch.cat([_x(r, n, dev) for r in range(world)]))
        form = "the input being this rank's chunk of the output"
    else:
        inp = _x(rank, n * world, dev)
        out = inp[rank * n:(rank + 1) * n]
        want = sum(_x(r, n * world, dev)[rank * n:(rank + 1) * n] for r in range(world))
        pg._reduce_scatter_base(out, inp, _opts(dist.ReduceScatterOptions, reduceOp=dist.ReduceOp.SUM)).wait()
        ctx.acc.synchronize()
        bad = _differs("output", out, want)
        form = "the output being this rank's chunk of the input"
    flag = ctx.agree_max([1.0 if bad else 0.0])[0]
    if bad:
        raise CheckFailed(f"{collective} in place ({form}, as FSDP2 issues it; NCCL supports it) on rank {rank}: "
                          f"the out-of-place call was right, the in-place one wrong: {bad}")
    if flag:
        raise CheckFailed(f"{collective} in place ({form}): right on this rank, wrong on another")
    return f"; in place ({form}) right"
