"""`StridedSafeGloo`: torch's ProcessGroupGloo with non-contiguous tensors staged through contiguous copies.

Why: on torch 2.13.0, ProcessGroupGloo reads and writes a tensor as `numel` contiguous elements from
its data pointer, ignoring strides, in broadcast, all_reduce, reduce and scatter (measured here: a
column view `base[:, 1]` of a 3x4 tensor, broadcast from rank 0, comes back on rank 1 as root's
`base[0, 1:4]`, and rank 1's neighbouring elements are overwritten). gather and all_gather were
fixed upstream (pytorch/pytorch#158903); the rest is open as pytorch/pytorch#192920. NCCL refuses
such tensors instead ("Tensors must be contiguous"). docs/writing-a-plugin.md has the write-up.

The workaround is the one torch applied for gather: every tensor argument that is not contiguous is
replaced by a contiguous copy, the inner gloo op runs on the copies, and the copies of the op's
outputs (its first argument: the in-place tensor of broadcast/all_reduce/reduce/recv, the output
list of the others) are copied back into the caller's tensors when the work completes (`wait()`, or
the work's future). Calls whose tensors are all contiguous go straight to gloo and return its work.
Used wherever the HAL's CPU fabric is gloo (`hal.emulation.emulate.create_cpu_process_group`), so the `cpu`
chip, every emulated chip and a plugin whose CCL is gloo (the `hal new-plugin` template) get it.

It also refuses, before calling gloo, a collective x dtype x reduce op that gloo does not support
(not in `hal/data/gloo_capabilities.json`, measured by `python -m hal_cpu.measure_capabilities`) with
`hal.NotSupportedError` naming collective, dtype, op and rank, where gloo itself raises untyped
RuntimeErrors ("Invalid scalar type", "Cannot use ReduceOp.PREMUL_SUM with Gloo") or fails only at
`wait()` (AVG on integers): an undeclared combination raises a typed error (the contract of
`hal_collective_capabilities`). The check is one set lookup per call. A declared combination that
the installed torch's own gloo lacks (torch 2.5: hal.emulation.gloo_fallback lists them) runs through
that module's fallback, so the declaration holds on every supported torch.
"""
from __future__ import annotations

import atexit
import weakref
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist

from hal.contract.capabilities import reduce_op_name
from hal.contract.errors import NotSupportedError
from hal.emulation import gloo_fallback
from hal.emulation.cpu_fabric import cpu_fabric_capabilities
from hal.emulation.named_group import NamedProcessGroup

# ProcessGroupGloo method -> collective name of the capability matrix.
_COLLECTIVE = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce", "reduce": "reduce",
    "broadcast": "broadcast", "allgather": "all_gather", "_allgather_base": "all_gather_into_tensor",
    "allgather_coalesced": "all_gather", "allgather_into_tensor_coalesced": "all_gather_into_tensor",
    "gather": "gather", "scatter": "scatter", "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
    "alltoall": "all_to_all", "alltoall_base": "all_to_all_single", "send": "send_recv", "recv": "send_recv",
    "recv_anysource": "send_recv",
}
_REDUCING = {"all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor"}
_SUPPORTED: set = set()  # filled on first use from hal/data/gloo_capabilities.json
_live: "weakref.WeakSet[StridedSafeGloo]" = weakref.WeakSet()


@atexit.register
def _release_all() -> None:
    """Drop the inner gloo groups while the interpreter is whole: destroyed later, during teardown,
    gloo's threads could be left joinable, and the process aborts at exit ("terminate called
    without an active exception")."""
    for pg in list(_live):
        pg._gloo = None


def _supported() -> set:
    if not _SUPPORTED:
        _SUPPORTED.update(cpu_fabric_capabilities("gloo").entries)
    return _SUPPORTED


def _tensors(arg: Any):
    """Every tensor in `arg` (a tensor, or lists of lists of tensors)."""
    if isinstance(arg, torch.Tensor):
        yield arg
    elif isinstance(arg, (list, tuple)):
        for a in arg:
            yield from _tensors(a)


def _needs_staging(args: tuple) -> bool:
    a0 = args[0] if args else None
    if len(args) <= 2 and type(a0) is list and len(a0) == 1 and type(a0[0]) is torch.Tensor:
        return not a0[0].is_contiguous()  # the common ([tensor], opts) form, without a generator
    return any(not t.is_contiguous() for a in args for t in _tensors(a))


def _stage(arg: Any, pairs: Optional[list]) -> Any:
    """`arg` with each non-contiguous tensor replaced by a contiguous copy; (original, copy) pairs
    are appended to `pairs` when the op writes `arg` (so results are copied back)."""
    if isinstance(arg, torch.Tensor):
        if arg.is_contiguous():
            return arg
        copy = arg.contiguous()
        if pairs is not None:
            pairs.append((arg, copy))
        return copy
    if isinstance(arg, (list, tuple)):
        return [_stage(a, pairs) for a in arg]
    return arg


class _StagedWork(dist.Work):
    """The inner gloo work; on completion the staged outputs are copied into the caller's tensors."""

    def __init__(self, inner: dist.Work, pairs: list, keep: tuple):
        super().__init__()
        self._inner, self._pairs, self._keep, self._copied = inner, pairs, keep, False

    def _copy_back(self) -> None:
        if not self._copied:
            for original, copy in self._pairs:
                original.copy_(copy)
            self._copied = True

    def wait(self, timeout: Any = None) -> bool:
        if timeout is None or timeout == timedelta(0):
            self._inner.wait()
        else:
            self._inner.wait(timeout)
        self._copy_back()
        return True

    def is_completed(self) -> bool:
        return self._inner.is_completed()

    def is_success(self) -> bool:
        return self._inner.is_success()

    def exception(self) -> Any:
        return self._inner.exception()

    def source_rank(self) -> int:
        return self._inner.source_rank()

    def result(self) -> list:
        self.wait()
        return [original for original, _ in self._pairs] or self._inner.result()

    def get_future(self) -> torch.futures.Future:
        def done(fut: torch.futures.Future) -> Any:
            fut.value()  # re-raises the op's error
            self._copy_back()
            return [original for original, _ in self._pairs] or fut.value()
        return self._inner.get_future().then(done)


_VERDICTS: dict = {}  # (collective, dtype, RedOpType or None) -> None (native), _FALLBACK, or what is not
_FALLBACK = object()


def _check_supported(pg: "StridedSafeGloo", coll: str, args: tuple) -> bool:
    """Refuse what gloo does not support (see the module docstring) with a typed error; True when the
    installed torch's gloo lacks a declared combination (run it through gloo_fallback). Verdicts are
    cached per (collective, dtype, op): a dict lookup per call after the first."""
    a0 = args[0] if args else None
    if type(a0) is list and a0 and type(a0[0]) is torch.Tensor:  # the common [tensor, ...] form
        tensor = a0[0]
    else:
        tensor = next((t for a in args for t in _tensors(a)), None)
        if tensor is None:
            return False
    redop = None
    if coll in _REDUCING:
        last = args[-1]
        redop = last.reduceOp.op if hasattr(last, "reduceOp") else dist.ReduceOp.SUM
    key = (coll, tensor.dtype, redop)
    try:
        what = _VERDICTS[key]
    except KeyError:
        dtype = str(tensor.dtype).removeprefix("torch.")
        op = reduce_op_name(redop) if redop is not None else "-"
        what = None if (coll, dtype, op) in _supported() else f"dtype {dtype}" + (f", op {op}" if op != "-" else "")
        if what is None and (coll, dtype, op) not in gloo_fallback.native_entries():
            what = _FALLBACK
        _VERDICTS[key] = what
    if what is _FALLBACK:
        return True
    if what is not None:
        raise NotSupportedError(f"gloo {coll} on rank {pg.rank()} of {pg.size()}: {what} is not supported by torch "
                                f"{torch.__version__}'s ProcessGroupGloo (hal/data/gloo_capabilities.json, "
                                f"measured by `python -m hal_cpu.measure_capabilities --backend gloo`)")
    return False


def _forward(name: str, writes_first: bool = True):
    """A method that calls gloo's `name`, staging non-contiguous tensors (see the module docstring)."""
    coll = _COLLECTIVE[name]

    def method(self: "StridedSafeGloo", *args: Any) -> dist.Work:
        if _check_supported(self, coll, args):
            return gloo_fallback.run(self, name, args)
        inner = getattr(self._gloo, name)
        if not _needs_staging(args):
            return inner(*args)
        pairs: list = []
        staged = tuple(_stage(a, pairs if (i == 0 and writes_first) else None) for i, a in enumerate(args))
        return _StagedWork(inner(*staged), pairs, staged)

    method.__name__ = name
    method.__doc__ = f"ProcessGroupGloo.{name}, with non-contiguous tensors staged through contiguous copies."
    return method


class StridedSafeGloo(NamedProcessGroup):
    """A `dist.ProcessGroup` with ProcessGroupGloo's methods, correct for non-contiguous tensors.

    Works for `dist.*(..., group=pg)` and direct calls (`pg.broadcast([t], opts).wait()`); the gloo
    group itself is `pg.gloo`."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta):
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        _live.add(self)

    @property
    def gloo(self) -> dist.ProcessGroup:
        return self._gloo

    def getBackendName(self) -> str:
        return "gloo"

    def __repr__(self) -> str:
        return f"StridedSafeGloo(rank={self.rank()}, size={self.size()})"

    # In-place or output-first collectives: the first argument receives the result.
    allreduce = _forward("allreduce")
    allreduce_coalesced = _forward("allreduce_coalesced")
    reduce = _forward("reduce")
    broadcast = _forward("broadcast")
    allgather = _forward("allgather")
    _allgather_base = _forward("_allgather_base")
    allgather_coalesced = _forward("allgather_coalesced")
    allgather_into_tensor_coalesced = _forward("allgather_into_tensor_coalesced")
    gather = _forward("gather")
    scatter = _forward("scatter")
    reduce_scatter = _forward("reduce_scatter")
    _reduce_scatter_base = _forward("_reduce_scatter_base")
    reduce_scatter_tensor_coalesced = _forward("reduce_scatter_tensor_coalesced")
    alltoall = _forward("alltoall")
    alltoall_base = _forward("alltoall_base")
    recv = _forward("recv")
    recv_anysource = _forward("recv_anysource")
    # Nothing written back: the staged copy is only kept alive until the work completes.
    send = _forward("send", writes_first=False)

    def barrier(self, opts: Any = None) -> dist.Work:
        return self._gloo.barrier(opts) if opts is not None else self._gloo.barrier()

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        return self._gloo.monitored_barrier(timeout, wait_all_ranks)

    def abort(self) -> None:
        abort = getattr(self._gloo, "abort", None)
        if abort is not None:
            abort()

    def shutdown(self) -> None:
        shutdown = getattr(self._gloo, "shutdown", None)
        if shutdown is not None:
            shutdown()
