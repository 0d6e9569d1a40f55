"""One inner process group plus what it does natively (`hal.CapabilityMatrix`); emulates the rest.

Every inner group the bridge uses -- a sub-cluster's vendor CCL, a rail's gloo group, the global gloo
group -- is wrapped in a `Ccl`. For each (collective, dtype, reduce op) it picks a route once and
caches it (a dict hit per call afterwards):

- `native`: the inner group does it;
- `bits:<carrier>`: a collective that only moves data runs on the tensor's bits viewed as a dtype
  the CCL moves (uint8 first; e.g. Kunlun's XCCL declares only float16/bfloat16/float32, so int64
  travels as float32 pairs). Moving data copies bytes, so no value is changed (odd byte counts are
  padded in a scratch copy);
- `widen:<dtype>`: a reduction the CCL lacks in this dtype runs in a wider one and is narrowed back
  (integers: bit-exact, sums and products wrap the same way; bool: through uint8; 16-bit floats:
  float32 accumulation, more accurate than the CCL would have been);
- `via_all_reduce` / `via_all_gather` / `via_p2p`: a collective the CCL lacks is built from one it
  has (a reduce-scatter from an all-reduce and a slice, a broadcast from an all-gather, ...);
- `gather_reduce`: a reduce op the CCL lacks in every dtype (Kunlun: MAX, MIN, PRODUCT, integers) is
  done by all-gathering the inputs and reducing locally in rank order -- the same inputs in the same
  order on every rank, so every rank gets the same bits.

Nothing is silently wrong: when no route exists the call raises `hal.NotSupportedError` naming the
group, the chip, the collective, the dtype and the op. Calls return a `Handle`; `Handle.wait()`
finishes the inner work and any copy back, turning an inner failure into `StageFailure` naming
this group and step.
"""
from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any, Callable, Optional, Sequence

import torch
from torch._C import _distributed_c10d as c10d

from hal.contract.capabilities import CapabilityMatrix, dtype_name
from hal.contract.errors import NotSupportedError

from .reduction import TORCH_OP, WIDER, local_reduce

CARRIERS = (torch.uint8, torch.int8, torch.float16, torch.bfloat16, torch.int16, torch.float32, torch.int32,
            torch.int64, torch.float64)


class StageFailure(Exception):
    """An inner group's operation failed; `stage` names the group and the step (internal: the
    process group turns it into BridgeTimeoutError / BridgePeerError with the op and sequence)."""

    def __init__(self, stage: str, cause: BaseException):
        self.stage, self.cause = stage, cause
        super().__init__(f"{stage}: {type(cause).__name__}: {cause}")


class Handle:
    """Issued inner work; `wait()` completes it and runs the finishing copies exactly once.

    `timeout` (set by `Ccl` for groups on a device) is passed to the inner works' `wait`: a device
    CCL's work (NCCL, HCCL, XCCL) waited without one only orders streams and returns before the data
    is there, and a collective that never completes would then surface as a process teardown by the
    CCL's watchdog; with it the waiting thread blocks until the work completes or raises when the
    timeout passes (torch 2.13 ProcessGroupNCCL.cpp `WorkNCCL::wait`), which becomes a StageFailure."""

    __slots__ = ("works", "finish", "stage", "timeout", "_done")

    def __init__(self, works: Sequence = (), finish: Optional[Callable[[], None]] = None, stage: str = "",
                 timeout: Optional[timedelta] = None):
        self.works, self.finish, self.stage, self.timeout, self._done = list(works), finish, stage, timeout, False

    def wait(self) -> None:
        if self._done:
            return
        try:
            for w in self.works:
                if self.timeout is not None and not isinstance(w, Handle):
                    w.wait(self.timeout)
                else:
                    w.wait()
        except StageFailure:
            raise
        except Exception as exc:
            raise StageFailure(self.stage, exc) from exc
        self._done = True
        if self.finish is not None:
            self.finish()


DONE = Handle()


def _guarded(fn):
    """An inner group that fails when the op is *issued* (a peer already gone) raises RuntimeError
    (c10d's DistBackendError is one); report it like a failure at wait time, naming the group.
    Handles from a device group get the group's timeout for their inner waits (see `Handle`)."""
    @functools.wraps(fn)
    def call(self, *args, **kwargs):
        try:
            h = fn(self, *args, **kwargs)
        except StageFailure:
            raise
        except RuntimeError as exc:
            raise StageFailure(self._stage(fn.__name__), exc) from exc
        if self._wait_timeout is not None and h is not DONE and h.timeout is None:
            h.timeout = self._wait_timeout
        return h
    return call


def _opts(cls, **kw):
    o = cls()
    for k, v in kw.items():
        setattr(o, k, v)
    return o


def _bits(t: torch.Tensor, carrier: torch.dtype, blocks: int = 1):
    """View `t` (made of `blocks` equal blocks) as `carrier`, padding each block to a whole number of
    carrier elements in a copy when needed; a strided `t` always goes through a copy (a byte view
    needs unit stride). Returns (view, block_bytes, copy_buf); a non-None copy_buf must be copied
    back into an output with `_unbits`."""
    src = t if t.is_contiguous() else t.contiguous()
    raw = src.reshape(-1).view(torch.uint8) if src.dtype != torch.uint8 else src.reshape(-1)
    cs = carrier.itemsize
    nb = raw.numel() // blocks
    if src is t and cs == 1:
        return raw.view(carrier), nb, None
    if src is t and nb % cs == 0 and raw.storage_offset() % cs == 0:
        return raw.view(carrier), nb, None
    pb = -(-nb // cs) * cs
    buf = torch.zeros(blocks * pb, dtype=torch.uint8, device=t.device)
    buf.view(blocks, pb)[:, :nb].copy_(raw.view(blocks, nb))
    return buf.view(carrier), nb, buf


def _unbits(t: torch.Tensor, buf: torch.Tensor, nb: int, blocks: int = 1) -> None:
    data = buf.view(blocks, -1)[:, :nb]
    if not t.is_contiguous():  # strided output: through its dtype
        t.copy_(data.reshape(-1).view(t.dtype).view(t.shape))
        return
    raw = t.reshape(-1).view(torch.uint8) if t.dtype != torch.uint8 else t.reshape(-1)
    raw.view(blocks, nb).copy_(data)


class Ccl:
    """`pg` (group ranks 0..size-1, this process is `rank`) with capabilities `caps`.

    `label` names the group in errors ("cuda sub-cluster CCL (ranks [0, 1])"); `device` is where this
    group's tensors live (the chip's device for a vendor group, cpu for gloo)."""

    def __init__(self, pg, caps: CapabilityMatrix, label: str, rank: int, size: int,
                 device: torch.device, timeout: Optional[timedelta] = None):
        self.pg, self.caps, self.label, self.rank, self.size = pg, caps, label, rank, size
        self.device = device
        self.timeout = timeout
        # A device CCL's works are waited with the group timeout (host CPU fabrics enforce their own).
        self._wait_timeout = timeout if timeout is not None and device.type != "cpu" else None
        # the single-tensor collectives under their torch name of this version (None: the CCL has none)
        self._ag: Any = getattr(pg, "_allgather_base", None) or getattr(pg, "all_gather_single", None)
        self._rs: Any = getattr(pg, "_reduce_scatter_base", None) or getattr(pg, "reduce_scatter_single", None)
        self._a2a: Any = getattr(pg, "alltoall_base", None) or getattr(pg, "all_to_all_single", None)
        self._routes: dict[tuple, str] = {}
        self.route_counts: dict[tuple, int] = {}

    def __repr__(self) -> str:
        return f"Ccl({self.label}, rank {self.rank}/{self.size})"

    # ---- route selection (cached) --------------------------------------------------------------
    def route(self, coll: str, dtype: torch.dtype, op: Optional[str] = None) -> str:
        key = (coll, dtype, op)
        r = self._routes.get(key)
        if r is None:
            r = self._routes[key] = self._choose(coll, dtype, op)
        self.route_counts[key] = self.route_counts.get(key, 0) + 1
        return r

    def _has(self, coll: str, dtype: torch.dtype, op: Optional[str] = None) -> bool:
        return self.caps.supports(coll, dtype_name(dtype), op)

    def _carrier(self, coll: str) -> Optional[torch.dtype]:
        return next((d for d in CARRIERS if self._has(coll, d)), None)

    def _choose(self, coll: str, dtype: torch.dtype, op: Optional[str]) -> str:
        if self._has(coll, dtype, op):
            return "native"
        if op is None:
            carrier = self._carrier(coll)
            if carrier is not None:
                return f"bits:{dtype_name(carrier)}"
            fallback = {"broadcast": ("all_gather_into_tensor", "via_all_gather"),
                        "all_gather_into_tensor": ("broadcast", "via_broadcast"),
                        "all_to_all_single": ("send_recv", "via_p2p"),
                        "gather": ("all_gather_into_tensor", "via_all_gather"),
                        "scatter": ("broadcast", "via_broadcast")}.get(coll)
            if fallback and self._carrier(fallback[0]) is not None:
                return fallback[1]
            raise self._refuse(coll, dtype, op)
        for wide in WIDER.get(dtype, ()):
            if self._has(coll, wide, op):
                return f"widen:{dtype_name(wide)}"
        if coll in ("reduce", "reduce_scatter_tensor") and (
                self._has("all_reduce", dtype, op)
                or any(self._has("all_reduce", w, op) for w in WIDER.get(dtype, ()))):
            return "via_all_reduce"
        if self._carrier("all_gather_into_tensor") is not None:
            return "gather_reduce"
        raise self._refuse(coll, dtype, op)

    def _refuse(self, coll: str, dtype: torch.dtype, op: Optional[str]) -> NotSupportedError:
        what = f"{coll} dtype={dtype_name(dtype)}" + (f" op={op}" if op else "")
        return NotSupportedError(f"hetero: {self.label}: {what} is neither native to chip "
                                 f"{self.caps.chip!r} ({self.caps.source}) nor emulable from what it has")

    def _stage(self, what: str) -> str:
        return f"{what} on {self.label}"

    # ---- reductions ------------------------------------------------------------------------------
    @_guarded
    def all_reduce(self, t: torch.Tensor, op: str) -> Handle:
        """In place on contiguous `t`."""
        if self.size == 1:
            return DONE
        r = self.route("all_reduce", t.dtype, op)
        stage = self._stage(f"all_reduce {dtype_name(t.dtype)} {op}")
        if r == "native":
            return Handle([self.pg.allreduce([t], _opts(c10d.AllreduceOptions, reduceOp=TORCH_OP[op]))], stage=stage)
        if r.startswith("widen:"):
            wide = t.to(getattr(torch, r[6:]))
            w = self.pg.allreduce([wide], _opts(c10d.AllreduceOptions, reduceOp=TORCH_OP[op]))
            return Handle([w], lambda: t.copy_(wide != 0 if t.dtype == torch.bool else wide), stage)
        return self._gather_reduce(t, t, op, stage)

    def _gather_reduce(self, out: torch.Tensor, inp: torch.Tensor, op: str, stage: str,
                       block: Optional[int] = None) -> Handle:
        stack = torch.empty((self.size, inp.numel()), dtype=inp.dtype, device=inp.device)
        h = self.all_gather_into_tensor(stack.view(-1), inp.reshape(-1))

        def finish():
            res = local_reduce(stack, op, inp.dtype)
            if block is None:
                out.view(-1).copy_(res)
            else:
                out.view(-1).copy_(res[self.rank * block:(self.rank + 1) * block])
        return Handle([h], finish, stage)

    @_guarded
    def reduce(self, t: torch.Tensor, root: int, op: str) -> Handle:
        """Root gets the reduction; other ranks' `t` is unspecified afterwards (may hold it too)."""
        if self.size == 1:
            return DONE
        r = self.route("reduce", t.dtype, op)
        stage = self._stage(f"reduce {dtype_name(t.dtype)} {op} to {root}")
        o = dict(reduceOp=TORCH_OP[op], rootRank=root, rootTensor=0)
        if r == "native":
            return Handle([self.pg.reduce([t], _opts(c10d.ReduceOptions, **o))], stage=stage)
        if r.startswith("widen:"):
            wide = t.to(getattr(torch, r[6:]))
            w = self.pg.reduce([wide], _opts(c10d.ReduceOptions, **o))
            return Handle([w], lambda: t.copy_(wide != 0 if t.dtype == torch.bool else wide), stage)
        return self.all_reduce(t, op)

    @_guarded
    def reduce_scatter_tensor(self, out: torch.Tensor, inp: torch.Tensor, op: str) -> Handle:
        """`inp` holds size * out.numel() elements; this rank gets the reduction of its block."""
        if self.size == 1:
            out.view(-1).copy_(inp.view(-1))
            return DONE
        r = self.route("reduce_scatter_tensor", inp.dtype, op)
        stage = self._stage(f"reduce_scatter {dtype_name(inp.dtype)} {op}")
        opts = _opts(c10d.ReduceScatterOptions, reduceOp=TORCH_OP[op])
        if r == "native":
            return Handle([self._rs(out, inp, opts)], stage=stage)
        if r.startswith("widen:"):
            wd = getattr(torch, r[6:])
            wi, wo = inp.to(wd), torch.empty(out.shape, dtype=wd, device=out.device)
            return Handle([self._rs(wo, wi, opts)],
                          lambda: out.copy_(wo != 0 if out.dtype == torch.bool else wo), stage)
        n = out.numel()
        if r == "via_all_reduce":
            tmp = inp.clone()
            h = self.all_reduce(tmp, op)
            return Handle([h], lambda: out.view(-1).copy_(tmp.view(-1)[self.rank * n:(self.rank + 1) * n]), stage)
        return self._gather_reduce(out, inp, op, stage, block=n)

    # ---- data movement ---------------------------------------------------------------------------
    @_guarded
    def all_gather_into_tensor(self, out: torch.Tensor, inp: torch.Tensor) -> Handle:
        if self.size == 1:
            out.view(-1).copy_(inp.view(-1))
            return DONE
        r = self.route("all_gather_into_tensor", inp.dtype)
        stage = self._stage(f"all_gather {dtype_name(inp.dtype)}")
        if r == "native":
            return Handle([self._ag(out, inp, c10d.AllgatherOptions())], stage=stage)
        if r.startswith("bits:"):
            carrier = getattr(torch, r[5:])
            vi, nb, _ = _bits(inp, carrier)
            vo, _, pad = _bits(out, carrier, blocks=self.size)
            w = self._ag(vo, vi, c10d.AllgatherOptions())
            return Handle([w], (lambda: _unbits(out, pad, nb, self.size)) if pad is not None else None, stage)
        n = inp.numel()  # via_broadcast: every rank broadcasts its block in turn
        flat = out.view(-1)
        flat[self.rank * n:(self.rank + 1) * n].copy_(inp.view(-1))
        return Handle([self.broadcast(flat[i * n:(i + 1) * n], i) for i in range(self.size)], stage=stage)

    @_guarded
    def broadcast(self, t: torch.Tensor, root: int) -> Handle:
        if self.size == 1:
            return DONE
        r = self.route("broadcast", t.dtype)
        stage = self._stage(f"broadcast from {root}")
        opts = _opts(c10d.BroadcastOptions, rootRank=root, rootTensor=0)
        if r == "native":
            return Handle([self.pg.broadcast([t], opts)], stage=stage)
        if r.startswith("bits:"):
            v, nb, pad = _bits(t, getattr(torch, r[5:]))
            w = self.pg.broadcast([v], opts)
            return Handle([w], (lambda: _unbits(t, pad, nb)) if pad is not None else None, stage)
        stack = torch.empty((self.size, t.numel()), dtype=t.dtype, device=t.device)
        h = self.all_gather_into_tensor(stack.view(-1), t.reshape(-1))
        return Handle([h], lambda: t.view(-1).copy_(stack[root]), stage)

    @_guarded
    def all_to_all_single(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int],
                          in_splits: list[int]) -> Handle:
        """Flat 1-D `out`/`inp`; splits in elements (uneven allowed). Strided views (a caller's
        `x[::2]`) go through contiguous copies: the byte views of the `bits:` and p2p routes need
        unit stride."""
        if self.size == 1:
            out.copy_(inp)
            return DONE
        if not (inp.is_contiguous() and out.is_contiguous()):
            co = torch.empty(out.shape, dtype=out.dtype, device=out.device)
            h = self.all_to_all_single(co, inp.contiguous(), out_splits, in_splits)
            return Handle([h], lambda: out.copy_(co), self._stage("all_to_all"))
        r = self.route("all_to_all_single", inp.dtype)
        stage = self._stage("all_to_all")
        opts = c10d.AllToAllOptions()
        if r == "native":
            return Handle([self._a2a(out, inp, list(out_splits), list(in_splits), opts)], stage=stage)
        e = inp.element_size()
        if r.startswith("bits:"):
            carrier = getattr(torch, r[5:])
            cs = carrier.itemsize
            if all((s * e) % cs == 0 for s in list(out_splits) + list(in_splits)):
                vi, _, _ = _bits(inp, carrier)
                vo, _, _ = _bits(out, carrier)
                if vi.data_ptr() == inp.data_ptr() and vo.data_ptr() == out.data_ptr():
                    return Handle([self._a2a(vo, vi, [s * e // cs for s in out_splits],
                                             [s * e // cs for s in in_splits], opts)], stage=stage)
        works = []  # pairwise send/recv (each message padded to the carrier if needed)
        in_off = [sum(in_splits[:i]) for i in range(self.size)]
        out_off = [sum(out_splits[:i]) for i in range(self.size)]
        out[out_off[self.rank]:out_off[self.rank] + out_splits[self.rank]].copy_(
            inp[in_off[self.rank]:in_off[self.rank] + in_splits[self.rank]])
        for peer in range(self.size):
            if peer != self.rank and in_splits[peer]:
                works.append(self.send(inp[in_off[peer]:in_off[peer] + in_splits[peer]], peer, 0))
            if peer != self.rank and out_splits[peer]:
                works.append(self.recv(out[out_off[peer]:out_off[peer] + out_splits[peer]], peer, 0))
        return Handle(works, stage=stage)

    def _p2p_view(self, t: torch.Tensor):
        r = self.route("send_recv", t.dtype)
        if r == "native":
            return t, None, 0
        if r.startswith("bits:"):
            v, nb, pad = _bits(t, getattr(torch, r[5:]))
            return v, pad, nb
        raise self._refuse("send_recv", t.dtype, None)

    @_guarded
    def send(self, t: torch.Tensor, dst: int, tag: int) -> Handle:
        v, _, _ = self._p2p_view(t)
        return Handle([self.pg.send([v], dst, tag)], stage=self._stage(f"send to {dst}"))

    @_guarded
    def recv(self, t: torch.Tensor, src: int, tag: int) -> Handle:
        v, pad, nb = self._p2p_view(t)
        return Handle([self.pg.recv([v], src, tag)], (lambda: _unbits(t, pad, nb)) if pad is not None else None,
                      stage=self._stage(f"recv from {src}"))

    @_guarded
    def gather(self, out: Optional[torch.Tensor], inp: torch.Tensor, root: int) -> Handle:
        """Flat `inp`; at `root`, `out` holds size * inp.numel() elements (else None)."""
        if self.rank == root:
            assert out is not None, "gather: the root needs an output tensor"
        if self.size == 1:
            assert out is not None
            out.view(-1).copy_(inp.view(-1))
            return DONE
        r = self.route("gather", inp.dtype)
        stage = self._stage(f"gather to {root}")
        opts = _opts(c10d.GatherOptions, rootRank=root)
        if r == "native" or r.startswith("bits:"):
            carrier = inp.dtype if r == "native" else getattr(torch, r[5:])
            vi, nb, _ = _bits(inp, carrier) if r != "native" else (inp, 0, None)
            outs, pad = [], None
            if self.rank == root:
                assert out is not None
                vo, _, pad = _bits(out, carrier, blocks=self.size) if r != "native" else (out.view(-1), 0, None)
                m = vo.numel() // self.size
                outs = [[vo[i * m:(i + 1) * m] for i in range(self.size)]]
            w = self.pg.gather(outs, [vi], opts)
            return Handle([w], (lambda: _unbits(out, pad, nb, self.size)) if pad is not None else None, stage)
        stack = torch.empty((self.size * inp.numel(),), dtype=inp.dtype, device=inp.device)
        h = self.all_gather_into_tensor(stack, inp)
        if self.rank != root or out is None:
            return Handle([h], None, stage)
        dst = out
        return Handle([h], lambda: dst.view(-1).copy_(stack), stage)

    @_guarded
    def scatter(self, out: torch.Tensor, inp: Optional[torch.Tensor], root: int) -> Handle:
        """Flat `out`; at `root`, `inp` holds size * out.numel() elements."""
        if self.rank == root:
            assert inp is not None, "scatter: the root needs an input tensor"
        if self.size == 1:
            assert inp is not None
            out.view(-1).copy_(inp.view(-1))
            return DONE
        r = self.route("scatter", out.dtype)
        stage = self._stage(f"scatter from {root}")
        n = out.numel()
        opts = _opts(c10d.ScatterOptions, rootRank=root)
        if r == "native" or r.startswith("bits:"):
            carrier = out.dtype if r == "native" else getattr(torch, r[5:])
            vo, nb, pad = _bits(out, carrier) if r != "native" else (out.view(-1), 0, None)
            ins = []
            if self.rank == root:
                assert inp is not None
                vi, _, _ = _bits(inp, carrier, blocks=self.size) if r != "native" else (inp.view(-1), 0, None)
                m = vi.numel() // self.size
                ins = [[vi[i * m:(i + 1) * m] for i in range(self.size)]]
            w = self.pg.scatter([vo], ins, opts)
            return Handle([w], (lambda: _unbits(out, pad, nb)) if pad is not None else None, stage)
        full = inp.reshape(-1).clone() if inp is not None and self.rank == root else \
            torch.empty(self.size * n, dtype=out.dtype, device=out.device)
        h = self.broadcast(full, root)
        return Handle([h], lambda: out.view(-1).copy_(full[self.rank * n:(self.rank + 1) * n]), stage)

    @_guarded
    def barrier(self) -> Handle:
        if self.size == 1:
            return DONE
        if self._has("barrier", torch.float32) or self._has("barrier", torch.uint8):
            return Handle([self.pg.barrier(c10d.BarrierOptions())], stage=self._stage("barrier"))
        t = torch.zeros(1, dtype=torch.float32, device=self.device)
        return self.all_reduce(t, "sum")
