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
    """A torch.distributed options object with `fields` set."""
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
        """The case in words, as a verdict names it."""
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
        out: list[tuple[str, Optional[str]]] = []
        for name, view, before, inside, writes in self._items:
            base = view if self.layout == "contiguous" or view.numel() == 0 else None
            if base is None:
                base = _base_of(view, self.layout, before.numel())
            after = base.detach().to("cpu")
            if writes:
                if (~inside).any():
                    why = verdict_exact(_pick(after, ~inside), _pick(before, ~inside))
                    if why:
                        out.append((f"{name}: elements outside the view (neighbours in the caller's buffer)",
                                    f"overwritten: {why}"))
            else:
                why = verdict_exact(after, before)
                if why:
                    out.append((f"{name} (an input)", f"changed by the call: {why}"))
        return out


def _pick(t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """t[mask], through the bytes for float8 (torch 2.5 cannot index float8 on CPU)."""
    if t.is_floating_point() and t.element_size() == 1:
        return t.view(torch.uint8)[mask].view(t.dtype)
    return t[mask]


def _base_of(view: torch.Tensor, layout: str, total: int) -> torch.Tensor:
    """The whole guarded buffer behind a view made by `Placed.put`."""
    start = view.storage_offset() - (_PAD if layout == "offset" else 1)
    return torch.as_strided(view, (total,), (1,), start)


def run_case(pg: Any, case: Case, rank: int, world: int, device: torch.device,
             tag: str = "c") -> list[tuple[str, Optional[str]]]:
    """Run `case` on `pg`; [(output name, None or what is wrong)] for this rank, including inputs the
    call changed and elements it wrote outside the caller's views."""
    placed = Placed(case.layout, device, 1000 * rank)
    call = _CALLS.get(case.collective)
    if call is None:
        raise ValueError(f"unknown collective {case.collective!r}")
    checks = call(_Call(pg, case, rank, world, placed, tag))
    return checks + placed.problems()


Checks = list[tuple[str, Optional[str]]]


@dataclass(frozen=True)
class _Call:
    """What one collective call needs: the group, the case, this rank, the world, where its tensors
    go, and the tag that seeds every rank's inputs (so each rank can rebuild any rank's input)."""

    pg: Any
    case: Case
    rank: int
    world: int
    placed: Placed
    tag: str

    def inp(self, r: int, n: Optional[int] = None) -> torch.Tensor:
        """Rank r's input of n elements (default: the case's size)."""
        return make_input(r, self.case.dtype, self.case.size if n is None else n, self.tag, self.case.op)

    def empty(self, k: int) -> torch.Tensor:
        return torch.zeros(k, dtype=getattr(torch, self.case.dtype))

    @property
    def reduce_name(self) -> str:
        """The reduce op of a reducing case (its name); only reducing collectives ask."""
        assert self.case.op is not None, f"{self.case.collective}: no reduce op"
        return self.case.op

    def op(self) -> Any:
        return reduce_op(self.reduce_name)


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu")


def _all_reduce(x: _Call) -> Checks:
    t = x.placed.put("tensor", x.inp(x.rank), writes=True)
    x.pg.allreduce([t], _opts(dist.AllreduceOptions, reduceOp=x.op())).wait()
    return [("output", verdict_reduce(_host(t), [x.inp(r) for r in range(x.world)], x.reduce_name, x.case.dtype))]


def _reduce(x: _Call) -> Checks:
    """Only the root's result is defined."""
    t = x.placed.put("tensor", x.inp(x.rank), writes=True)
    x.pg.reduce([t], _opts(dist.ReduceOptions, reduceOp=x.op(), rootRank=x.case.root)).wait()
    if x.rank != x.case.root:
        return [("non-root (not checked)", None)]
    return [("root output", verdict_reduce(_host(t), [x.inp(r) for r in range(x.world)], x.reduce_name, x.case.dtype))]


def _reduce_scatter(x: _Call) -> Checks:
    """Rank r contributes world chunks of n; output chunk j is the reduction of every rank's chunk j."""
    n, world = x.case.size, x.world
    out = x.placed.put("output", x.empty(n), writes=True)
    o = _opts(dist.ReduceScatterOptions, reduceOp=x.op())
    if x.case.collective == "reduce_scatter":
        chunks = [x.placed.put(f"input[{j}]", x.inp(x.rank, n * world)[j * n:(j + 1) * n], writes=False)
                  for j in range(world)]
        x.pg.reduce_scatter([out], [chunks], o).wait()
    else:
        x.pg._reduce_scatter_base(out, x.placed.put("input", x.inp(x.rank, n * world), writes=False), o).wait()
    want = [x.inp(r, n * world)[x.rank * n:(x.rank + 1) * n] for r in range(world)]
    return [("output", verdict_reduce(_host(out), want, x.reduce_name, x.case.dtype))]


def _broadcast(x: _Call) -> Checks:
    t = x.placed.put("tensor", x.inp(x.rank), writes=True)
    x.pg.broadcast([t], _opts(dist.BroadcastOptions, rootRank=x.case.root)).wait()
    return [("output", verdict_exact(_host(t), x.inp(x.case.root)))]


def _all_gather(x: _Call) -> Checks:
    outs = [x.placed.put(f"output[{r}]", x.empty(x.case.size), writes=True) for r in range(x.world)]
    x.pg.allgather([outs], [x.placed.put("input", x.inp(x.rank), writes=False)]).wait()
    return [(f"output[{r}]", verdict_exact(_host(o), x.inp(r))) for r, o in enumerate(outs)]


def _all_gather_into_tensor(x: _Call) -> Checks:
    out = x.placed.put("output", x.empty(x.case.size * x.world), writes=True)
    x.pg._allgather_base(out, x.placed.put("input", x.inp(x.rank), writes=False)).wait()
    return [("output", verdict_exact(_host(out), torch.cat([x.inp(r) for r in range(x.world)])))]


def _all_to_all(x: _Call) -> Checks:
    """Rank src sends `_split(src, dst)` elements to each dst, cut in order from its one input."""
    world, rank, uneven = x.world, x.rank, x.case.uneven
    base = max(x.case.size // world, 0)

    def send(src: int) -> torch.Tensor:
        return x.inp(src, sum(_split(src, j, base, uneven) for j in range(world)))

    def piece(src: int, dst: int) -> torch.Tensor:
        off = sum(_split(src, j, base, uneven) for j in range(dst))
        return send(src)[off:off + _split(src, dst, base, uneven)]
    in_splits = [_split(rank, j, base, uneven) for j in range(world)]
    out_splits = [_split(j, rank, base, uneven) for j in range(world)]
    want = [piece(j, rank) for j in range(world)]
    if x.case.collective == "all_to_all_single":
        inp = x.placed.put("input", send(rank), writes=False)
        out = x.placed.put("output", x.empty(sum(out_splits)), writes=True)
        x.pg.alltoall_base(out, inp, out_splits, in_splits, dist.AllToAllOptions()).wait()
        return [("output", verdict_exact(_host(out), torch.cat(want)))]
    ins = [x.placed.put(f"input[{j}]", p, writes=False) for j, p in enumerate(send(rank).split(in_splits))]
    outs = [x.placed.put(f"output[{j}]", x.empty(s), writes=True) for j, s in enumerate(out_splits)]
    x.pg.alltoall(outs, ins, dist.AllToAllOptions()).wait()
    return [(f"output[{j}]", verdict_exact(_host(o), w)) for j, (o, w) in enumerate(zip(outs, want))]


def _gather(x: _Call) -> Checks:
    """Only the root passes (and checks) output tensors."""
    root = x.case.root
    inp = x.placed.put("input", x.inp(x.rank), writes=False)
    outs = ([[x.placed.put(f"output[{r}]", x.empty(x.case.size), writes=True) for r in range(x.world)]]
            if x.rank == root else [])
    x.pg.gather(outs, [inp], _opts(dist.GatherOptions, rootRank=root)).wait()
    if x.rank != root:
        return [("non-root (nothing received)", None)]
    return [(f"root output[{r}]", verdict_exact(_host(o), x.inp(r))) for r, o in enumerate(outs[0])]


def _scatter(x: _Call) -> Checks:
    """Only the root passes input tensors; every rank checks its piece."""
    root = x.case.root
    out = x.placed.put("output", x.empty(x.case.size), writes=True)
    ins = ([[x.placed.put(f"input[{r}]", x.inp(r), writes=False) for r in range(x.world)]]
           if x.rank == root else [])
    x.pg.scatter([out], ins, _opts(dist.ScatterOptions, rootRank=root)).wait()
    return [("output", verdict_exact(_host(out), x.inp(x.rank)))]


def _send_recv(x: _Call) -> Checks:
    """A ring: every rank sends to rank + 1 and receives from rank - 1, both posted before waiting."""
    dst, src = (x.rank + 1) % x.world, (x.rank - 1) % x.world
    out = x.placed.put("received", x.empty(x.case.size), writes=True)
    works = [x.pg.send([x.placed.put("sent", x.inp(x.rank), writes=False)], dst, 7), x.pg.recv([out], src, 7)]
    for w in works:
        w.wait()
    return [(f"received from rank {src}", verdict_exact(_host(out), x.inp(src)))]


def _barrier(x: _Call) -> Checks:
    x.pg.barrier().wait()
    return [("barrier", None)]


# collective name -> the call that runs it and checks this rank's result
_CALLS: dict[str, Callable[[_Call], Checks]] = {
    "all_reduce": _all_reduce, "reduce": _reduce, "reduce_scatter": _reduce_scatter,
    "reduce_scatter_tensor": _reduce_scatter, "broadcast": _broadcast, "all_gather": _all_gather,
    "all_gather_into_tensor": _all_gather_into_tensor, "all_to_all": _all_to_all,
    "all_to_all_single": _all_to_all, "gather": _gather, "scatter": _scatter, "send_recv": _send_recv,
    "barrier": _barrier,
}
