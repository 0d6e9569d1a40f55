"""What the HAL's gloo group declares but the installed torch's own ProcessGroupGloo lacks, done with
the gloo ops it has.

hal/data/gloo_capabilities.json (what `cpu_fabric_capabilities("gloo")` declares for the `cpu` chip and
every emulated chip) was measured on torch 2.13. torch 2.5, the floor, measured the same way
(hal/data/gloo_capabilities_torch2.5.json), lacks: list `reduce_scatter` ("ProcessGroupGloo does not
support reduce_scatter"), list `alltoall` ("Backend gloo does not support alltoall"), AVG in all_reduce
and reduce ("Cannot use ReduceOp.AVG with Gloo"), and every op but SUM in `_reduce_scatter_base`
(which sums whatever op it is given: silently wrong). `hal.contract.compat.gloo_measured_file` picks
the matrix measured on the installed torch; a declared combination missing from it runs here:

- AVG: SUM, then a division by the group size (on every rank for all_reduce, on the root for reduce);
- reduce_scatter, reduce_scatter_tensor(+coalesced): an all_reduce of the whole input, then this rank's
  block copied out (n times the traffic of a real reduce-scatter: correct, not fast);
- all_to_all (lists): one `alltoall_base` over the flattened, concatenated blocks, split back.

Each fallback calls the HAL group's own methods (`StridedSafeGloo`), so strided tensors are staged and
a fallback that needs another (reduce_scatter with AVG) chains. On torch 2.13 nothing here runs.
"""
from __future__ import annotations

import json
from datetime import timedelta
from functools import lru_cache
from importlib import resources
from typing import Any, Callable

import torch
import torch.distributed as dist

from hal.contract.capabilities import CapabilityMatrix, reduce_op_name
from hal.contract.compat import gloo_measured_file
from hal.contract.errors import NotSupportedError


@lru_cache(maxsize=1)
def native_entries() -> frozenset:
    """(collective, dtype, op) entries this torch's own ProcessGroupGloo supports, as measured."""
    data = json.loads((resources.files("hal") / "data" / gloo_measured_file()).read_text())
    return frozenset(tuple(e) for e in data["entries"])


def native_capabilities() -> CapabilityMatrix:
    """What torch's own ProcessGroupGloo does right on this torch: the matrix for a raw gloo group
    (the bridge's global and rail groups), as opposed to the HAL's gloo group with its fallbacks."""
    return CapabilityMatrix(chip="cpu", entries=native_entries(),
                            source=f"torch's own gloo, hal/data/{gloo_measured_file()}")


class FinishWork(dist.Work):
    """The inner works; once all are done, `finish()` runs once (the division, the copy-out). Its
    result is the op's output tensors, as gloo's own work gives them."""

    def __init__(self, inner: list, finish: Callable[[], None], outputs: list):
        super().__init__()
        self._inner, self._finish, self._done, self._outputs = inner, finish, False, list(outputs)

    def _complete(self) -> None:
        if not self._done:
            self._finish()
            self._done = True

    def wait(self, timeout: Any = None) -> bool:
        for w in self._inner:
            if timeout is None or timeout == timedelta(0):
                w.wait()
            else:
                w.wait(timeout)
        self._complete()
        return True

    def is_completed(self) -> bool:
        return self._done or all(w.is_completed() for w in self._inner)

    def is_success(self) -> bool:
        return all(w.is_success() for w in self._inner)

    def exception(self) -> Any:
        return next((e for e in (w.exception() for w in self._inner) if e is not None), None)

    def result(self) -> list:
        self.wait()
        return self._outputs

    def get_future(self) -> torch.futures.Future:
        futs = [w.get_future() for w in self._inner]

        def done(fut: torch.futures.Future) -> Any:
            for f in fut.value():
                f.value()  # re-raises the op's error
            self._complete()
            return self._outputs
        return torch.futures.collect_all(futs).then(done)


def _opts(cls: Any, op: Any, **fields: Any) -> Any:
    o = cls()
    o.reduceOp = op
    for k, v in fields.items():
        setattr(o, k, v)
    return o


def _op(opts: Any) -> Any:
    return opts.reduceOp if opts is not None and hasattr(opts, "reduceOp") else dist.ReduceOp.SUM


def _only_avg(pg: Any, what: str, opts: Any) -> None:
    """The AVG fallbacks do SUM + divide: refuse any other op rather than compute the wrong thing."""
    op = _op(opts)
    if getattr(op, "op", op) != dist.ReduceOp.AVG:
        raise NotSupportedError(f"gloo {what} on rank {pg.rank()} of {pg.size()}: op {reduce_op_name(op)} is "
                                f"missing from torch {torch.__version__}'s ProcessGroupGloo and has no fallback")


def _divide(tensors: list, n: int) -> Callable[[], None]:
    def finish() -> None:
        for t in tensors:
            t.div_(n)
    return finish


def _allreduce(pg: Any, tensors: list, opts: Any = None) -> dist.Work:
    """all_reduce AVG as SUM, then a division on every rank."""
    _only_avg(pg, "all_reduce", opts)
    work = pg.allreduce(tensors, _opts(dist.AllreduceOptions, dist.ReduceOp.SUM))
    return FinishWork([work], _divide(tensors, pg.size()), tensors)


def _allreduce_coalesced(pg: Any, tensors: list, opts: Any = None) -> dist.Work:
    _only_avg(pg, "all_reduce_coalesced", opts)
    work = pg.allreduce_coalesced(tensors, _opts(dist.AllreduceCoalescedOptions, dist.ReduceOp.SUM))
    return FinishWork([work], _divide(tensors, pg.size()), tensors)


def _reduce(pg: Any, tensors: list, opts: Any) -> dist.Work:
    """reduce AVG as SUM, then a division on the root."""
    _only_avg(pg, "reduce", opts)
    root = opts.rootRank
    work = pg.reduce(tensors, _opts(dist.ReduceOptions, dist.ReduceOp.SUM, rootRank=root, rootTensor=opts.rootTensor))
    return FinishWork([work], _divide(tensors if pg.rank() == root else [], pg.size()), tensors)


def _all_reduce_then_slice(pg: Any, out: torch.Tensor, flat: torch.Tensor, offset: int, op: Any) -> FinishWork:
    """`out` = this rank's block [offset, offset + out.numel()) of the all-reduced `flat` (a private copy)."""
    work = pg.allreduce([flat], _opts(dist.AllreduceOptions, op))

    def finish() -> None:
        out.copy_(flat[offset:offset + out.numel()].view_as(out))
    return FinishWork([work], finish, [out])


def _reduce_scatter(pg: Any, outputs: list, inputs: list, opts: Any = None) -> dist.Work:
    """List reduce_scatter: output[0] = the reduction of every rank's inputs[0][rank]."""
    blocks = inputs[0]
    flat = torch.cat([b.reshape(-1) for b in blocks])
    offset = sum(b.numel() for b in blocks[:pg.rank()])
    return _all_reduce_then_slice(pg, outputs[0], flat, offset, _op(opts))


def _reduce_scatter_base(pg: Any, out: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> dist.Work:
    flat = inp.reshape(-1).clone()
    return _all_reduce_then_slice(pg, out, flat, pg.rank() * out.numel(), _op(opts))


def _reduce_scatter_tensor_coalesced(pg: Any, outs: list, ins: list, opts: Any = None) -> dist.Work:
    works = [_reduce_scatter_base(pg, o, i, opts) for o, i in zip(outs, ins)]
    return FinishWork(works, lambda: None, outs)


def _alltoall(pg: Any, outs: list, ins: list, opts: Any = None) -> dist.Work:
    """List all_to_all as one alltoall_base over the flattened blocks (splits in elements)."""
    src = torch.cat([t.reshape(-1) for t in ins])
    dst = torch.empty(sum(t.numel() for t in outs), dtype=outs[0].dtype)
    work = pg.alltoall_base(dst, src, [t.numel() for t in outs], [t.numel() for t in ins],
                            opts if opts is not None else dist.AllToAllOptions())

    def finish() -> None:
        for t, piece in zip(outs, dst.split([o.numel() for o in outs])):
            t.copy_(piece.view_as(t))
    return FinishWork([work], finish, outs)


# ProcessGroupGloo method name -> its fallback (called with the HAL group and the method's arguments)
FALLBACKS: dict[str, Callable[..., dist.Work]] = {
    "allreduce": _allreduce, "allreduce_coalesced": _allreduce_coalesced, "reduce": _reduce,
    "reduce_scatter": _reduce_scatter, "_reduce_scatter_base": _reduce_scatter_base,
    "reduce_scatter_tensor_coalesced": _reduce_scatter_tensor_coalesced, "alltoall": _alltoall,
}


def run(pg: Any, name: str, args: tuple) -> dist.Work:
    """Gloo method `name` through its fallback; a typed error if there is none (a declared combination
    the installed torch lacks and this module does not cover)."""
    fallback = FALLBACKS.get(name)
    if fallback is None:
        raise NotSupportedError(f"gloo {name} on rank {pg.rank()} of {pg.size()}: declared by "
                                f"hal/data/gloo_capabilities.json but missing from torch {torch.__version__}'s "
                                f"ProcessGroupGloo ({gloo_measured_file()}), and hal.emulation.gloo_fallback has "
                                f"no fallback for it")
    return fallback(pg, *args)
