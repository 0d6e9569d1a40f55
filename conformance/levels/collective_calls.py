"""One collective on a process group, and the result each rank should see.

The calls use the process-group object's own methods (`pg.allreduce([t], opts)`, ...), which is what
`Accelerator.new_process_group` returns (the vendor's group, or the CPU fabric's). Each `run_case`
makes this rank's inputs on the chip's device, runs the collective, waits, and returns a list of
(what, got, golden-check) so the caller can give a verdict that names the case.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from .collective_golden import PREMUL_FACTOR, make_input, verdict_exact, verdict_reduce

_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
        "product": dist.ReduceOp.PRODUCT, "band": dist.ReduceOp.BAND, "bor": dist.ReduceOp.BOR,
        "bxor": dist.ReduceOp.BXOR}


def reduce_op(name: str) -> Any:
    if name == "premul_sum":
        return dist._make_nccl_premul_sum(PREMUL_FACTOR)
    return _OPS[name]


def _opts(cls, **fields):
    o = cls()
    for k, v in fields.items():
        setattr(o, k, v)
    return o


@dataclass(frozen=True)
class Case:
    """One call: collective, dtype, reduce op (or None), elements per rank, root, uneven splits."""

    collective: str
    dtype: str
    op: Optional[str]
    size: int
    root: int = 0
    uneven: bool = False

    @property
    def optional(self) -> bool:
        """A feature the capability matrix has no words for: a CCL may refuse it (raise), never get
        it wrong. The list form of all_to_all with tensors of different sizes is one (gloo refuses)."""
        return self.collective == "all_to_all" and self.uneven

    def describe(self) -> str:
        parts = [self.collective, f"dtype={self.dtype}"]
        if self.op:
            parts.append(f"op={self.op}")
        parts.append(f"size={self.size}")
        if self.collective in ROOTED:
            parts.append(f"root={self.root}")
        if self.collective in ("all_to_all", "all_to_all_single"):
            parts.append("uneven splits" if self.uneven else "even splits")
        return " ".join(parts)


ROOTED = ("reduce", "broadcast", "gather", "scatter")


def _split(src: int, dst: int, base: int, uneven: bool) -> int:
    """Elements rank `src` sends to rank `dst` in all_to_all."""
    return base + ((src + 2 * dst) % 3 if uneven else 0)


def run_case(pg: Any, case: Case, rank: int, world: int, device: torch.device,
             tag: str = "c") -> list[tuple[str, Optional[str]]]:
    """Run `case` on `pg`; [(output name, None or what is wrong)] for this rank."""
    c, d, n = case.collective, case.dtype, case.size
    inp: Callable[[int], torch.Tensor] = lambda r: make_input(r, d, n, tag, case.op)  # noqa: E731
    dev = lambda t: t.to(device)  # noqa: E731
    host = lambda t: t.detach().to("cpu")  # noqa: E731
    if c == "all_reduce":
        t = dev(inp(rank))
        pg.allreduce([t], _opts(dist.AllreduceOptions, reduceOp=reduce_op(case.op))).wait()
        return [("output", verdict_reduce(host(t), [inp(r) for r in range(world)], case.op, d))]
    if c == "reduce":
        t = dev(inp(rank))
        pg.reduce([t], _opts(dist.ReduceOptions, reduceOp=reduce_op(case.op), rootRank=case.root)).wait()
        if rank != case.root:
            return [("non-root (not checked)", None)]
        return [("root output", verdict_reduce(host(t), [inp(r) for r in range(world)], case.op, d))]
    if c in ("reduce_scatter", "reduce_scatter_tensor"):
        # Rank r contributes world chunks of n; output chunk j is the reduction of every rank's chunk j.
        full = lambda r: make_input(r, d, n * world, tag, case.op)  # noqa: E731
        out = dev(torch.empty(n, dtype=getattr(torch, d)))
        x = dev(full(rank))
        o = _opts(dist.ReduceScatterOptions, reduceOp=reduce_op(case.op))
        if c == "reduce_scatter":
            pg.reduce_scatter([out], [list(x.split(n)) if n else [x[:0] for _ in range(world)]], o).wait()
        else:
            pg._reduce_scatter_base(out, x, o).wait()
        want = [full(r)[rank * n:(rank + 1) * n] for r in range(world)]
        return [("output", verdict_reduce(host(out), want, case.op, d))]
    if c == "broadcast":
        t = dev(inp(rank))
        pg.broadcast([t], _opts(dist.BroadcastOptions, rootRank=case.root)).wait()
        return [("output", verdict_exact(host(t), inp(case.root)))]
    if c == "all_gather":
        outs = [dev(torch.empty(n, dtype=getattr(torch, d))) for _ in range(world)]
        pg.allgather([outs], [dev(inp(rank))]).wait()
        return [(f"output[{r}]", verdict_exact(host(o), inp(r))) for r, o in enumerate(outs)]
    if c == "all_gather_into_tensor":
        out = dev(torch.empty(n * world, dtype=getattr(torch, d)))
        pg._allgather_base(out, dev(inp(rank))).wait()
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
        x = dev(send(rank))
        if c == "all_to_all_single":
            out = dev(torch.empty(sum(out_splits), dtype=getattr(torch, d)))
            pg.alltoall_base(out, x, out_splits, in_splits, dist.AllToAllOptions()).wait()
            return [("output", verdict_exact(host(out), torch.cat(want)))]
        outs = [dev(torch.empty(s, dtype=getattr(torch, d))) for s in out_splits]
        pg.alltoall(outs, list(x.split(in_splits)), dist.AllToAllOptions()).wait()
        return [(f"output[{j}]", verdict_exact(host(o), w)) for j, (o, w) in enumerate(zip(outs, want))]
    if c == "gather":
        outs = [[dev(torch.empty(n, dtype=getattr(torch, d))) for _ in range(world)]] if rank == case.root else []
        pg.gather(outs, [dev(inp(rank))], _opts(dist.GatherOptions, rootRank=case.root)).wait()
        if rank != case.root:
            return [("non-root (nothing received)", None)]
        return [(f"root output[{r}]", verdict_exact(host(o), inp(r))) for r, o in enumerate(outs[0])]
    if c == "scatter":
        out = dev(torch.empty(n, dtype=getattr(torch, d)))
        ins = [[dev(inp(r)) for r in range(world)]] if rank == case.root else []
        pg.scatter([out], ins, _opts(dist.ScatterOptions, rootRank=case.root)).wait()
        return [("output", verdict_exact(host(out), inp(rank)))]
    if c == "send_recv":
        # A ring: every rank sends to rank + 1 and receives from rank - 1, both posted before waiting.
        dst, src = (rank + 1) % world, (rank - 1) % world
        out = dev(torch.empty(n, dtype=getattr(torch, d)))
        works = [pg.send([dev(inp(rank))], dst, 7), pg.recv([out], src, 7)]
        for w in works:
            w.wait()
        return [(f"received from rank {src}", verdict_exact(host(out), inp(src)))]
    if c == "barrier":
        pg.barrier().wait()
        return [("barrier", None)]
    raise ValueError(f"unknown collective {c!r}")
