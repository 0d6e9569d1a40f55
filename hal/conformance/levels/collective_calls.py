"""One collective on a process group, and the result each rank should see.

The calls use the process-group object's own methods (`pg.allreduce([t], opts)`, ...), which is what
`Accelerator.new_process_group` returns (the vendor's group, or the CPU fabric's). Each `run_case`
makes this rank's inputs on the chip's device in the case's layout (contiguous, a view with a
storage offset, a strided view: each a window into a guarded buffer), runs the collective, waits,
and returns a list of (what, verdict) so the caller can give a verdict that names the case: the
result must land in the caller's view, nothing outside the views may change, and inputs must be
left as they were.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from hal.contract.capabilities import TORCH_REDUCE_OPS

from .collective_golden import PREMUL_FACTOR, make_input, verdict_exact, verdict_reduce

_OPS = TORCH_REDUCE_OPS  # hal's reduce-op name table


def reduce_op(name: str) -> Any:
    if name == "premul_sum":
        return dist._make_nccl_premul_sum(PREMUL_FACTOR)
    return _OPS[name]


def _opts(cls, **fields):
    o = cls()
    for k, v in fields.items():
        setattr(o, k, v)
    return o


LAYOUTS = ("contiguous", "offset", "strided")
_PAD = 3  # guard elements before and after an offset view


@dataclass(frozen=True)
class Case:
    """One call: collective, dtype, reduce op (or None), elements per rank, root, uneven splits, and
    the layout of every tensor argument: `contiguous`, `offset` (a view starting `_PAD` elements into
    a larger buffer: a storage offset) or `strided` (every other element of a larger buffer)."""

    collective: str
    dtype: str
    op: Optional[str]
    size: int
    root: int = 0
    uneven: bool = False
    layout: str = "contiguous"

    @property
    def optional(self) -> bool:
        """A feature a CCL may refuse (raise on every rank), never get wrong: the list form of
        all_to_all with tensors of different sizes (gloo refuses it), and strided views (NCCL
        refuses them: "Tensors must be contiguous")."""
        return (self.collective == "all_to_all" and self.uneven) or self.layout == "strided"

    def describe(self) -> str:
        parts = [self.collective, f"dtype={self.dtype}"]
        if self.op:
            parts.append(f"op={self.op}")
        parts.append(f"size={self.size}")
        if self.collective in ROOTED:
            parts.append(f"root={self.root}")
        if self.collective in ("all_to_all", "all_to_all_single"):
            parts.append("uneven splits" if self.uneven else "even splits")
        if self.layout != "contiguous":
            parts.append("views with a storage offset" if self.layout == "offset" else "strided views")
        return " ".join(parts)


ROOTED = ("reduce", "broadcast", "gather", "scatter")


def _split(src: int, dst: int, base: int, uneven: bool) -> int:
    """Elements rank `src` sends to rank `dst` in all_to_all."""
    return base + ((src + 2 * dst) % 3 if uneven else 0)


class Placed:
    """Tensors handed to a collective in the case's layout, each a view into a guarded buffer, so
    that after the call one can ask: did the result land in the caller's view, did anything outside
    it change (neighbouring elements), did an input change at all."""

    def __init__(self, layout: str, device: torch.device, guard_seed: int):
        self.layout, self.device = layout, device
        self._seed = guard_seed
        self._items: list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor, bool]] = []

    def put(self, name: str, value: torch.Tensor, writes: bool) -> torch.Tensor:
        """`value` (a 1-D host tensor) on the device in the layout; `writes`: the call may write it."""
        n = value.numel()
        if self.layout == "contiguous" or n == 0:
            view = value.clone().to(self.device)
            base, inside = view, torch.ones(n, dtype=torch.bool)
        else:
            total = n + 2 * _PAD if self.layout == "offset" else 2 * n + 1
            guard = make_input(self._seed + len(self._items), value.dtype.__str__().removeprefix("torch."), total,
                               "guard", None)
            base = guard.clone().to(self.device)
            idx = torch.arange(_PAD, _PAD + n) if self.layout == "offset" else torch.arange(1, 2 * n + 1, 2)
            view = base[_PAD:_PAD + n] if self.layout == "offset" else base[1:2 * n + 1:2]
            view.copy_(value.to(self.device))
            inside = torch.zeros(total, dtype=torch.bool)
            inside[idx] = True
        self._items.append((name, view, base.detach().to("cpu").clone(), inside, writes))
        return view

    def problems(self) -> list[tuple[str, Optional[str]]]:
        """Inputs changed, or elements outside an output's view overwritten."""
        out = []
        for name, view, before, inside, writes in self._items:
            base = view if self.layout == "contiguous" or view.numel() == 0 else None
            if base is None:
                base = _base_of(view, self.layout, before.numel())
            after = base.detach().to("cpu")
            if writes:
                if (~inside).any():
                    why = verdict_exact(after[~inside], before[~inside])
                    if why:
                        out.append((f"{name}: elements outside the view (neighbours in the caller's buffer)",
                                    f"overwritten: {why}"))
            else:
                why = verdict_exact(after, before)
                if why:
                    out.append((f"{name} (an input)", f"changed by the call: {why}"))
        return out


def _base_of(view: torch.Tensor, layout: str, total: int) -> torch.Tensor:
    """The whole guarded buffer behind a view made by `Placed.put`."""
    start = view.storage_offset() - (_PAD if layout == "offset" else 1)
    return torch.as_strided(view, (total,), (1,), start)


def run_case(pg: Any, case: Case, rank: int, world: int, device: torch.device,
             tag: str = "c") -> list[tuple[str, Optional[str]]]:
    """Run `case` on `pg`; [(output name, None or what is wrong)] for this rank, including inputs the
    call changed and elements it wrote outside the caller's views."""
    placed = Placed(case.layout, device, 1000 * rank)
    checks = _run(pg, case, rank, world, placed, tag)
    return checks + placed.problems()


def _run(pg: Any, case: Case, rank: int, world: int, placed: Placed, tag: str) -> list[tuple[str, Optional[str]]]:
    c, d, n = case.collective, case.dtype, case.size
    inp: Callable[[int], torch.Tensor] = lambda r: make_input(r, d, n, tag, case.op)  # noqa: E731
    empty = lambda k: torch.zeros(k, dtype=getattr(torch, d))  # noqa: E731
    host = lambda t: t.detach().to("cpu")  # noqa: E731
    if c == "all_reduce":
        t = placed.put("tensor", inp(rank), writes=True)
        pg.allreduce([t], _opts(dist.AllreduceOptions, reduceOp=reduce_op(case.op))).wait()
        return [("output", verdict_reduce(host(t), [inp(r) for r in range(world)], case.op, d))]
    if c == "reduce":
        t = placed.put("tensor", inp(rank), writes=True)
        pg.reduce([t], _opts(dist.ReduceOptions, reduceOp=reduce_op(case.op), rootRank=case.root)).wait()
        if rank != case.root:
            return [("non-root (not checked)", None)]
        return [("root output", verdict_reduce(host(t), [inp(r) for r in range(world)], case.op, d))]
    if c in ("reduce_scatter", "reduce_scatter_tensor"):
        # Rank r contributes world chunks of n; output chunk j is the reduction of every rank's chunk j.
        full = lambda r: make_input(r, d, n * world, tag, case.op)  # noqa: E731
        out = placed.put("output", empty(n), writes=True)
        o = _opts(dist.ReduceScatterOptions, reduceOp=reduce_op(case.op))
        if c == "reduce_scatter":
            chunks = [placed.put(f"input[{j}]", full(rank)[j * n:(j + 1) * n], writes=False) for j in range(world)]
            pg.reduce_scatter([out], [chunks], o).wait()
        else:
            x = placed.put("input", full(rank), writes=False)
            pg._reduce_scatter_base(out, x, o).wait()
        want = [full(r)[rank * n:(rank + 1) * n] for r in range(world)]
        return [("output", verdict_reduce(host(out), want, case.op, d))]
    if c == "broadcast":
        t = placed.put("tensor", inp(rank), writes=True)
        pg.broadcast([t], _opts(dist.BroadcastOptions, rootRank=case.root)).wait()
        return [("output", verdict_exact(host(t), inp(case.root)))]
    if c == "all_gather":
        outs = [placed.put(f"output[{r}]", empty(n), writes=True) for r in range(world)]
        pg.allgather([outs], [placed.put("input", inp(rank), writes=False)]).wait()
        return [(f"output[{r}]", verdict_exact(host(o), inp(r))) for r, o in enumerate(outs)]
    if c == "all_gather_into_tensor":
        out = placed.put("output", empty(n * world), writes=True)
        pg._allgather_base(out, placed.put("input", inp(rank), writes=False)).wait()
        return [("output", verdict_exact(host(out), torch.cat([inp(r) for r in range(world)])))]
    if c in ("all_to_all", "all_to_all_single"):
        base = max(n // world, 0)
        send = lambda src: make_input(src, d, sum(_split(src, j, base, case.uneven) for j in range(world)),  # noqa: E731
                                      tag, case.op)

        def piece(src: int, dst: int) -> torch.Tensor:
            off = sum(_split(src, j, base, case.uneven) for j in range(dst))
            return send(src)[off:off + _split(src, dst, base, case.uneven)]
        in_splits = [_split(rank, j, base, case.uneven) for j in range(world)]
        out_splits = [_split(j, rank, base, case.uneven) for j in range(world)]
        want = [piece(j, rank) for j in range(world)]
        if c == "all_to_all_single":
            x = placed.put("input", send(rank), writes=False)
            out = placed.put("output", empty(sum(out_splits)), writes=True)
            pg.alltoall_base(out, x, out_splits, in_splits, dist.AllToAllOptions()).wait()
            return [("output", verdict_exact(host(out), torch.cat(want)))]
        ins = [placed.put(f"input[{j}]", p, writes=False) for j, p in enumerate(send(rank).split(in_splits))]
        outs = [placed.put(f"output[{j}]", empty(s), writes=True) for j, s in enumerate(out_splits)]
        pg.alltoall(outs, ins, dist.AllToAllOptions()).wait()
        return [(f"output[{j}]", verdict_exact(host(o), w)) for j, (o, w) in enumerate(zip(outs, want))]
    if c == "gather":
        x = placed.put("input", inp(rank), writes=False)
        outs = ([[placed.put(f"output[{r}]", empty(n), writes=True) for r in range(world)]]
                if rank == case.root else [])
        pg.gather(outs, [x], _opts(dist.GatherOptions, rootRank=case.root)).wait()
        if rank != case.root:
            return [("non-root (nothing received)", None)]
        return [(f"root output[{r}]", verdict_exact(host(o), inp(r))) for r, o in enumerate(outs[0])]
    if c == "scatter":
        out = placed.put("output", empty(n), writes=True)
        ins = [[placed.put(f"input[{r}]", inp(r), writes=False) for r in range(world)]] if rank == case.root else []
        pg.scatter([out], ins, _opts(dist.ScatterOptions, rootRank=case.root)).wait()
        return [("output", verdict_exact(host(out), inp(rank)))]
    if c == "send_recv":
        # A ring: every rank sends to rank + 1 and receives from rank - 1, both posted before waiting.
        dst, src = (rank + 1) % world, (rank - 1) % world
        out = placed.put("received", empty(n), writes=True)
        works = [pg.send([placed.put("sent", inp(rank), writes=False)], dst, 7), pg.recv([out], src, 7)]
        for w in works:
            w.wait()
        return [(f"received from rank {src}", verdict_exact(host(out), inp(src)))]
    if c == "barrier":
        pg.barrier().wait()
        return [("barrier", None)]
    raise ValueError(f"unknown collective {c!r}")
