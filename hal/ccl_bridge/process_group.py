"""`HeteroProcessGroup`: the `hetero` group as torch sees it (a Python `dist.ProcessGroup`).

Each method takes torch's arguments (tensor lists and *Options objects, as `dist.*` and C++ callers
such as DDP's reducer pass them), validates them in the caller's thread (a bad argument raises
there, before anything is sent), then enqueues the algorithm on the group's executor and returns
a `BridgeWork`. Names cover both spellings torch 2.x uses (`all_gather_single` / `_allgather_base`,
`reduce_scatter_single` / `_reduce_scatter_base`, `all_to_all_single` / `alltoall_base`), plus
`setGroupName`/`getGroupName` that FSDP2's DeviceMesh needs.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist

from hal.contract.errors import HalError, NotSupportedError
from hal.emulation.named_group import NamedProcessGroup

from . import allreduce as _ar
from . import collectives as _co
from . import debug as _debug
from . import faults
from .errors import BridgeCollectiveError, BridgeMismatchError, BridgePeerError
from .fabric import Fabric
from .reduction import reduce_spec
from .work import BridgeWork, Executor, GroupState, classify

_log = logging.getLogger(__name__)
# Every live `hetero` group of this process: a failed device CCL breaks them all (`_abort_inner`).
_LIVE: "weakref.WeakSet[HeteroProcessGroup]" = weakref.WeakSet()


def _one(tensors: Sequence[torch.Tensor], what: str) -> torch.Tensor:
    if len(tensors) != 1:
        raise ValueError(f"hetero {what}: expected exactly one tensor per rank, got {len(tensors)}")
    return tensors[0]


class _Contig:
    """A contiguous stand-in for a possibly strided tensor; `back()` copies results into the original."""

    __slots__ = ("orig", "t")

    def __init__(self, t: torch.Tensor):
        self.orig = t
        self.t = t if t.is_contiguous() else t.contiguous()

    def back(self) -> None:
        if self.t is not self.orig:
            self.orig.copy_(self.t)


class HeteroProcessGroup(NamedProcessGroup):
    """One process group over every rank of a mixed cluster (see `ccl_bridge` for how it works)."""

    def __init__(self, fabric: Fabric):
        super().__init__(fabric.rank, fabric.world)
        self.fabric = fabric
        self._seq = 0
        self._state = GroupState(self._abort_inner)
        self._lock = threading.Lock()  # seq numbers and queue order must match (DDP calls from autograd threads)
        self._executor = Executor(f"{fabric.rank}", thread_init=fabric.sync.bind_thread)
        self._timeout_s = fabric.timeout.total_seconds()
        self.abort_errors: list[str] = []  # inner groups that refused to abort, and why
        _LIVE.add(self)

    # ---- identity ---------------------------------------------------------------------------------
    def getBackendName(self) -> str:
        return "hetero"

    def setGroupName(self, name: str) -> None:
        super().setGroupName(name)
        self.fabric.name = name

    def __repr__(self) -> str:
        t = self.fabric.topo
        clusters = ", ".join(f"{s.chip}{'(emulated)' if s.emulated else ''}x{s.size}" for s in t.subclusters)
        return f"HeteroProcessGroup(rank {self.fabric.rank}/{t.world_size}, {clusters})"

    def describe(self) -> dict:
        """Topology, settings and inner groups, for logs and `hal` reports."""
        fx = self.fabric
        return {"name": self._group_name, "rank": fx.rank, "world_size": fx.world,
                "topology": fx.topo.describe(), "config": fx.config.agreement_key(),
                "timeout_s": self._timeout_s, "collectives_issued": self._seq,
                "staging_allocations": fx.scratch.allocations, "staging_bytes": fx.scratch.bytes,
                "elements_moved": dict(fx.counters)}

    # ---- submission -------------------------------------------------------------------------------
    def _on_error(self, op: str, seq: int, t0: float) -> Callable[[BaseException], BaseException]:
        def handle(exc: BaseException) -> BaseException:
            if isinstance(exc, BridgeMismatchError):
                return exc  # every rank saw the same fingerprints and skipped the collective together
            if isinstance(exc, HalError) and not isinstance(exc, BridgeCollectiveError):
                err: BaseException = exc
            else:
                err = classify(exc, op=op, seq=seq, group=self._group_name, elapsed=time.monotonic() - t0)
            self._break(err)
            return err
        return handle

    @property
    def _broken(self) -> Optional[BaseException]:
        return self._state.broken

    def _break(self, err: BaseException) -> None:
        self._state.break_(err)

    def _abort_inner(self, err: BaseException) -> None:
        """Abort every inner group, so peers blocked on this rank fail before their own timeout; one
        that refuses is logged (`abort_errors`) and the others are still aborted.

        When this group's sub-cluster CCL is a device CCL (NCCL, HCCL, XCCL), every other `hetero`
        group of the process breaks too, aborting its groups: the device's CCL state is suspect
        after a failure, and the vendor group whose monitor acts on the dump signal a timeout
        broadcasts may be one of theirs (torch's ProcessGroupNCCL: the heartbeat monitor of the
        process's first NCCL group terminates the process after TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC
        unless that group was aborted; ProcessGroupNCCL.cpp `HeartbeatMonitor::runLoop`)."""
        for g in self.fabric.inner_groups:
            try:
                g.abort()
            except Exception as exc:  # keep going: every group must be aborted
                self.abort_errors.append(f"{type(g).__name__}.abort(): {type(exc).__name__}: {exc}")
                _log.warning("hetero group %r: aborting an inner group failed: %s", self._group_name,
                             self.abort_errors[-1])
        if self.fabric.intra.device.type == "cpu":
            return  # host fabrics (emulated chips): the other groups are not affected
        for other in list(_LIVE):
            if other is not self:
                other._break(BridgePeerError(
                    f"group {other._group_name!r}: broken because the device CCL of group {self._group_name!r} "
                    f"failed in this process: {err}", group=other._group_name))

    def _check_usable(self, op: str) -> None:
        if self._broken is not None:
            raise BridgePeerError(f"group {self._group_name!r}, op {op}: the group is unusable after an earlier "
                                  f"failure: {self._broken}", op=op, seq=self._seq, group=self._group_name)

    def _submit(self, op: str, result: Any, job: Callable[[], Any],
                fingerprint: Optional[dict] = None, p2p: bool = False) -> BridgeWork:
        self._check_usable(op)
        fx = self.fabric
        caller_ev = fx.sync.caller_event()
        with self._lock:
            seq = -1 if p2p else self._seq
            if not p2p:
                self._seq += 1
            return self._enqueue(op, seq, result, job, fingerprint, p2p, caller_ev)

    def _enqueue(self, op, seq, result, job, fingerprint, p2p, caller_ev) -> BridgeWork:
        fx = self.fabric
        work = BridgeWork(op, seq, self._group_name, result, self._timeout_s, fx.config.grace_s, self._state)
        fp = _debug.Fingerprint(seq=seq, op=op, **fingerprint) if (fx.config.debug and fingerprint is not None) \
            else None

        def run() -> Any:
            if self._broken is not None:
                raise BridgePeerError(f"group {self._group_name!r}, op {op} (collective #{seq}): the group is "
                                      f"unusable after an earlier failure: {self._broken}",
                                      op=op, seq=seq, group=self._group_name)
            if caller_ev is not None:
                caller_ev.synchronize()
            if not p2p:
                faults.point("collective.start")
            if fp is not None:
                _debug.check(fx, fp)
            res = job()
            fx.sync.host_ready()
            return res

        return self._executor.submit(run, work, self._on_error(op, seq, time.monotonic()))

    # ---- reductions -------------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        t = _one(tensors, "all_reduce")
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        spec = reduce_spec(op, t.dtype)
        c = _Contig(t)

        def job():
            _ar.all_reduce(self.fabric, c.t, spec)
            c.back()
        return self._submit("all_reduce", tensors, job,
                            dict(dtype=t.dtype, shape=tuple(t.shape), redop=spec.name))

    def allreduce_coalesced(self, tensors, opts=None):
        if not tensors:
            return self._submit("all_reduce_coalesced", tensors, lambda: None, None)
        dtype = tensors[0].dtype
        if any(x.dtype != dtype for x in tensors):
            raise ValueError("hetero all_reduce_coalesced: tensors must share one dtype")
        spec = reduce_spec(opts.reduceOp, dtype)
        total = sum(x.numel() for x in tensors)

        def job():
            flat = torch.cat([x.reshape(-1) for x in tensors])
            _ar.all_reduce(self.fabric, flat, spec)
            off = 0
            for x in tensors:
                x.copy_(flat[off:off + x.numel()].view_as(x))
                off += x.numel()
        return self._submit("all_reduce_coalesced", tensors, job, dict(dtype=dtype, shape=(total,), redop=spec.name))

    def reduce(self, tensors, opts):
        t = _one(tensors, "reduce")
        spec = reduce_spec(opts.reduceOp, t.dtype)
        root = opts.rootRank
        self._check_rank(root, "reduce")
        c = _Contig(t)

        def job():
            _ar.all_reduce(self.fabric, c.t, spec)  # every rank computes it; non-root contents are unspecified
            c.back()
        return self._submit("reduce", tensors, job, dict(dtype=t.dtype, shape=tuple(t.shape), root=root,
                                                         redop=spec.name))

    def reduce_scatter_single(self, output, input, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        spec = reduce_spec(op, input.dtype)
        w = self.fabric.world
        if input.numel() != output.numel() * w:
            raise ValueError(f"hetero reduce_scatter_tensor: input has {input.numel()} elements, expected "
                             f"output numel {output.numel()} x world size {w} = {output.numel() * w}")
        if input.dtype != output.dtype:
            raise ValueError(f"hetero reduce_scatter_tensor: dtypes differ ({input.dtype} vs {output.dtype})")
        ci, co = _Contig(input), _Contig(output)

        def job():
            _co.reduce_scatter_tensor(self.fabric, co.t.view(-1), ci.t.view(-1), spec)
            co.back()
        return self._submit("reduce_scatter_tensor", [output], job,
                            dict(dtype=input.dtype, shape=tuple(input.shape), redop=spec.name))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        out = _one(output_tensors, "reduce_scatter")
        ins = _one(input_tensors, "reduce_scatter")
        w = self.fabric.world
        if len(ins) != w or any(x.numel() != out.numel() or x.dtype != out.dtype for x in ins):
            raise ValueError(f"hetero reduce_scatter: expected {w} inputs shaped like the output "
                             f"({tuple(out.shape)}, {out.dtype})")
        spec = reduce_spec(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, out.dtype)
        co = _Contig(out)

        def job():
            flat = torch.cat([x.reshape(-1) for x in ins])
            _co.reduce_scatter_tensor(self.fabric, co.t.view(-1), flat, spec)
            co.back()
        return self._submit("reduce_scatter", output_tensors, job,
                            dict(dtype=out.dtype, shape=tuple(out.shape), redop=spec.name))

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        specs = [reduce_spec(opts.reduceOp, x.dtype) for x in inputs]

        def job():
            for o, i, s in zip(outputs, inputs, specs):
                co = _Contig(o)
                _co.reduce_scatter_tensor(self.fabric, co.t.view(-1), i.contiguous().view(-1), s)
                co.back()
        return self._submit("reduce_scatter_coalesced", outputs, job, dict(dtype=None, shape=(len(inputs),)))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # ---- data movement ----------------------------------------------------------------------------
    def broadcast(self, tensors, opts):
        t = _one(tensors, "broadcast")
        root = opts.rootRank
        self._check_rank(root, "broadcast")
        c = _Contig(t)

        def job():
            _co.broadcast(self.fabric, c.t, root)
            c.back()
        return self._submit("broadcast", tensors, job, dict(dtype=t.dtype, shape=tuple(t.shape), root=root))

    def all_gather_single(self, output, input, opts=None):
        w = self.fabric.world
        if output.numel() != input.numel() * w or output.dtype != input.dtype:
            raise ValueError(f"hetero all_gather_into_tensor: output has {output.numel()} {output.dtype} "
                             f"elements, expected {input.numel()} x world size {w} of {input.dtype}")
        ci, co = _Contig(input), _Contig(output)

        def job():
            _co.all_gather_into_tensor(self.fabric, co.t.view(-1), ci.t.view(-1))
            co.back()
        return self._submit("all_gather_into_tensor", [output], job, dict(dtype=input.dtype, shape=tuple(input.shape)))

    _allgather_base = all_gather_single

    def allgather(self, output_tensors, input_tensors, opts=None):
        outs = _one(output_tensors, "all_gather")
        inp = _one(input_tensors, "all_gather")
        w = self.fabric.world
        if len(outs) != w or any(o.numel() != inp.numel() or o.dtype != inp.dtype for o in outs):
            raise NotSupportedError(f"hetero all_gather: expected {w} outputs shaped like the input "
                                    f"({tuple(inp.shape)}, {inp.dtype}); uneven all_gather is not supported")

        def job():
            flat = torch.empty(w * inp.numel(), dtype=inp.dtype, device=inp.device)
            _co.all_gather_into_tensor(self.fabric, flat, inp.contiguous().view(-1))
            n = inp.numel()
            for r, o in enumerate(outs):
                o.copy_(flat[r * n:(r + 1) * n].view_as(o))
        return self._submit("all_gather", output_tensors, job, dict(dtype=inp.dtype, shape=tuple(inp.shape)))

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        def job():
            w = self.fabric.world
            for outs, inp in zip(output_lists, input_list):
                flat = torch.empty(w * inp.numel(), dtype=inp.dtype, device=inp.device)
                _co.all_gather_into_tensor(self.fabric, flat, inp.contiguous().view(-1))
                n = inp.numel()
                for r, o in enumerate(outs):
                    o.copy_(flat[r * n:(r + 1) * n].view_as(o))
        return self._submit("all_gather_coalesced", output_lists, job, dict(dtype=None, shape=(len(input_list),)))

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        def job():
            for o, i in zip(outputs, inputs):
                co = _Contig(o)
                _co.all_gather_into_tensor(self.fabric, co.t.view(-1), i.contiguous().view(-1))
                co.back()
        return self._submit("all_gather_coalesced", outputs, job, dict(dtype=None, shape=(len(inputs),)))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_tensors, input_tensors, opts):
        inp = _one(input_tensors, "gather")
        root = opts.rootRank
        self._check_rank(root, "gather")
        me = self.fabric.rank
        outs = output_tensors[0] if (me == root and output_tensors) else None
        w = self.fabric.world
        if me == root and (outs is None or len(outs) != w or any(o.numel() != inp.numel() for o in outs)):
            raise ValueError(f"hetero gather: root needs {w} outputs shaped like the input {tuple(inp.shape)}")

        def job():
            flat = torch.empty(w * inp.numel(), dtype=inp.dtype, device=inp.device) if outs is not None else None
            _co.gather(self.fabric, flat, inp.contiguous().view(-1), root)
            if outs is not None:
                n = inp.numel()
                for r, o in enumerate(outs):
                    o.copy_(flat[r * n:(r + 1) * n].view_as(o))
        return self._submit("gather", output_tensors, job, dict(dtype=inp.dtype, shape=tuple(inp.shape), root=root))

    def scatter(self, output_tensors, input_tensors, opts):
        out = _one(output_tensors, "scatter")
        root = opts.rootRank
        self._check_rank(root, "scatter")
        me = self.fabric.rank
        ins = input_tensors[0] if (me == root and input_tensors) else None
        w = self.fabric.world
        if me == root and (ins is None or len(ins) != w or any(x.numel() != out.numel() for x in ins)):
            raise ValueError(f"hetero scatter: root needs {w} inputs shaped like the output {tuple(out.shape)}")
        co = _Contig(out)

        def job():
            flat = torch.cat([x.reshape(-1) for x in ins]) if ins is not None else None
            _co.scatter(self.fabric, co.t.view(-1), flat, root)
            co.back()
        return self._submit("scatter", output_tensors, job, dict(dtype=out.dtype, shape=tuple(out.shape), root=root))

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        w = self.fabric.world
        in_el = self._splits(input, input_split_sizes, "input")
        out_el = self._splits(output, output_split_sizes, "output")
        ci, co = _Contig(input), _Contig(output)

        def job():
            _co.all_to_all_single(self.fabric, co.t.view(-1), ci.t.view(-1), out_el, in_el)
            co.back()
        return self._submit("all_to_all_single", [output], job,
                            dict(dtype=input.dtype, shape=(w,), check_shape=False))

    alltoall_base = all_to_all_single

    def _splits(self, t: torch.Tensor, splits: Sequence[int], which: str) -> list[int]:
        w = self.fabric.world
        if t.dim() == 0:
            raise ValueError(f"hetero all_to_all_single: {which} must have at least one dimension")
        row = t.numel() // t.shape[0] if t.shape[0] else 0
        if not splits:
            if t.shape[0] % w:
                raise ValueError(f"hetero all_to_all_single: {which} dim 0 = {t.shape[0]} is not divisible by "
                                 f"world size {w}; pass split sizes")
            return [t.numel() // w] * w
        if len(splits) != w or sum(splits) != t.shape[0]:
            raise ValueError(f"hetero all_to_all_single: {which} splits {list(splits)} must have {w} entries "
                             f"summing to dim 0 = {t.shape[0]}")
        return [int(s) * row for s in splits]

    def alltoall(self, output_tensors, input_tensors, opts=None):
        w = self.fabric.world
        if len(output_tensors) != w or len(input_tensors) != w:
            raise ValueError(f"hetero all_to_all: expected {w} input and {w} output tensors")
        dtype = input_tensors[0].dtype

        def job():
            flat_in = torch.cat([x.reshape(-1) for x in input_tensors])
            flat_out = torch.empty(sum(o.numel() for o in output_tensors), dtype=dtype, device=flat_in.device)
            _co.all_to_all_single(self.fabric, flat_out, flat_in, [o.numel() for o in output_tensors],
                                  [x.numel() for x in input_tensors])
            off = 0
            for o in output_tensors:
                o.copy_(flat_out[off:off + o.numel()].view_as(o))
                off += o.numel()
        return self._submit("all_to_all", output_tensors, job, dict(dtype=dtype, shape=(w,), check_shape=False))

    def barrier(self, opts=None):
        return self._submit("barrier", [], lambda: _co.barrier(self.fabric), dict(dtype=None, shape=None))

    # ---- point to point ---------------------------------------------------------------------------
    def send(self, tensors, dstRank, tag):
        t = _one(tensors, "send")
        self._check_rank(dstRank, "send")
        src = t if t.is_contiguous() else t.contiguous()
        return self._submit(f"send to {dstRank}", tensors, lambda: _co.send(self.fabric, src, dstRank, tag), p2p=True)

    def recv(self, tensors, srcRank, tag):
        t = _one(tensors, "recv")
        self._check_rank(srcRank, "recv")
        c = _Contig(t)

        def job():
            h = _co.recv(self.fabric, c.t, srcRank, tag)
            if c.t is c.orig:
                return h
            from .ccl import Handle
            return Handle([h], c.back, h.stage)
        return self._submit(f"recv from {srcRank}", tensors, job, p2p=True)

    def recv_anysource(self, tensors, tag):
        raise NotSupportedError("hetero: recv from any source is not supported (name the source rank)")

    # ---- helpers ----------------------------------------------------------------------------------
    def _check_rank(self, r: int, what: str) -> None:
        if not 0 <= r < self.fabric.world:
            raise ValueError(f"hetero {what}: rank {r} is outside the group (size {self.fabric.world})")

    def shutdown(self) -> None:
        self._executor.shutdown()

    def abort(self) -> None:
        self._break(BridgePeerError(f"group {self._group_name!r} aborted", group=self._group_name))
        self._executor.shutdown()
