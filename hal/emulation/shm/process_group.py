"""`ShmProcessGroup`: the torch.distributed process group of the shared-memory fabric.

A Python `dist.ProcessGroup` subclass with ProcessGroupGloo's method names and signatures, so it
serves both `dist.init_process_group("shm")` / `dist.new_group(backend="shm")` and direct calls
such as `pg.allreduce([t], opts).wait()`. CPU tensors only (host shared memory).

Implemented on shared memory: allreduce, broadcast, allgather, _allgather_base/all_gather_single,
reduce_scatter, _reduce_scatter_base/reduce_scatter_single, alltoall, alltoall_base/
all_to_all_single (uneven splits), barrier, send, recv, and the coalesced variants (one op per
tensor). Collectives run to completion in the calling thread (the returned work is already done);
send/recv run on the communicator's engine thread and complete at `wait()`.

Explicit fallback to an inner gloo group (created on first use, on a prefixed store): gather,
scatter, reduce, allgather_coalesced, monitored_barrier, tensor lists of more than one tensor per
rank, and dtypes the kernels do not know (complex, float8 reductions). Refused with a typed error:
AVG on integer/bool tensors (gloo refuses it too, so switching HAL_CPU_CCL never changes which
programs run), PREMUL_SUM, recv from any source, non-CPU tensors.
"""
from __future__ import annotations

import atexit
import threading
import weakref
from datetime import timedelta
from typing import Any, Callable, NoReturn, Optional

import torch
import torch.distributed as dist

from hal.emulation.named_group import NamedProcessGroup
from hal.emulation.shm.errors import ShmMismatchError, ShmUnsupportedError

_R = dist.ReduceOp.RedOpType
# Codes shared with csrc/shm_common.h (DType, RedOp).
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3, torch.int8: 4,
               torch.uint8: 5, torch.int16: 6, torch.int32: 7, torch.int64: 8, torch.bool: 9}
BYTES_CODE = 10  # any other dtype: moved as bytes, never reduced
REDOP_CODES = {_R.SUM: 0, _R.AVG: 1, _R.MAX: 2, _R.MIN: 3, _R.PRODUCT: 4, _R.BAND: 5, _R.BOR: 6, _R.BXOR: 7}

_DEFAULT_ALLREDUCE = dist.AllreduceOptions()
_DEFAULT_REDUCE_SCATTER = dist.ReduceScatterOptions()
_live: "weakref.WeakSet[ShmProcessGroup]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:  # stop engine threads before the interpreter tears down
    for pg in list(_live):
        pg.shutdown()


class _DoneWork(dist.Work):
    """A finished collective (shm collectives complete in the calling thread). Cheaper than a work
    made from a future (this sits on the small-message latency path); the future is built on demand
    and holds the output tensors, as gloo's does."""

    def __init__(self, result: Any):
        super().__init__()
        self._result = result

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:  # dist.Work's own says False until finish(), which is never called
        return True

    def get_future(self) -> torch.futures.Future:
        fut = torch.futures.Future()
        fut.set_result(self._result)
        return fut


_done = _DoneWork


def _one_by_one(single: Callable[..., dist.Work]) -> Callable[..., dist.Work]:
    """The coalesced form of a tensor-in-tensor collective: `single` on each (output, input) pair."""
    def coalesced(self: Any, outputs: list, inputs: list, opts: Any = None) -> dist.Work:
        for o, i in zip(outputs, inputs):
            single(self, o, i, opts)
        return _done(outputs)

    coalesced.__name__ = f"{single.__name__}_coalesced"
    return coalesced


class _P2PWork(dist.Work):
    """A send or recv in flight on the engine thread; `wait()` blocks until it finished or failed."""

    def __init__(self, pg: "ShmProcessGroup", op_id: int, tensors: list, copy_back=None):
        super().__init__()
        self._pg, self._id, self._tensors, self._copy_back, self._finished = pg, op_id, tensors, copy_back, False

    def wait(self, timeout: Any = None) -> bool:
        if not self._finished:
            try:
                self._pg._comm.wait(self._id)
            finally:
                self._finished = True
                with self._pg._p2p_lock:
                    self._pg._inflight.pop(self._id, None)
            if self._copy_back is not None:
                dst, tmp = self._copy_back
                dst.copy_(tmp)
        return True

    def is_completed(self) -> bool:
        """True once `wait()` finished: a recv's data lands in the caller's tensor only then."""
        return self._finished

    def get_future(self) -> torch.futures.Future:
        self.wait()
        fut = torch.futures.Future()
        fut.set_result(self._tensors)
        return fut


class ShmProcessGroup(NamedProcessGroup):
    """See the module docstring. Build with `hal.emulation.shm.create_shm_process_group`."""

    def __init__(self, comm: Any, store: Any, rank: int, size: int, timeout: timedelta, slot_bytes: int):
        super().__init__(rank, size)
        self._comm, self._store, self._timeout, self._slot_bytes = comm, store, timeout, slot_bytes
        self._rank, self._size = rank, size
        self._seq = 0
        self._gloo: Optional[dist.ProcessGroup] = None
        self._inflight: dict[int, list] = {}  # p2p op id -> buffers kept alive until done
        self._coll_lock = threading.Lock()
        self._p2p_lock = threading.Lock()  # _inflight is touched by senders and by Work.wait()
        _live.add(self)

    # ---- identity ---------------------------------------------------------------------------
    def getBackendName(self) -> str:
        return "shm"

    @property
    def segment_bytes(self) -> int:
        """Bytes of the shared segment (collective buffers + p2p channels)."""
        return self._comm.segment_bytes

    @property
    def slot_bytes(self) -> int:
        """Per-rank, per-buffer bytes of the collective area: the chunk size of large transfers."""
        return self._slot_bytes

    def __repr__(self) -> str:
        return f"ShmProcessGroup(rank={self._rank}, size={self._size}, segment={self.segment_bytes} bytes)"

    # ---- helpers ----------------------------------------------------------------------------
    def _issue(self, fn: Any, *args: Any) -> None:
        """Call a collective of the C++ communicator with the next sequence number. The lock keeps
        sequence order and fabric order the same when several threads of one process issue
        collectives (the bridge's executor and the caller's thread, DDP's autograd thread)."""
        with self._coll_lock:
            self._seq += 1
            fn(*args, self._seq)

    def _cpu(self, t: torch.Tensor, op: str) -> None:
        if t.device.type != "cpu":
            raise ShmUnsupportedError(f"shm {op}: tensor on {t.device}; the shm fabric moves host (CPU) "
                                      f"tensors only", rank=self._rank, op=op)

    def _redop(self, opts: Any, t: torch.Tensor, op: str) -> int:
        code = REDOP_CODES.get(opts.reduceOp.op)
        dt = DTYPE_CODES.get(t.dtype, BYTES_CODE)
        # codes: floats 0-3, integers 4-8, bool 9; AVG is 1, bitwise ops 5-7
        if code is None or (code == 1 and dt >= 4) or (code >= 5 and dt < 4):
            self._refuse(opts, t, op)
        return code

    def _refuse(self, opts: Any, t: torch.Tensor, op: str) -> NoReturn:
        rop = opts.reduceOp.op
        name = str(rop).split(".")[-1].lower()
        if rop == _R.AVG:
            raise ShmUnsupportedError(
                f"shm {op}: AVG on {t.dtype} is refused (gloo refuses it too); use SUM and divide",
                rank=self._rank, op=op)
        if REDOP_CODES.get(rop) is not None:
            raise ShmUnsupportedError(f"shm {op}: bitwise op {name} on floating dtype {t.dtype}",
                                      rank=self._rank, op=op)
        raise ShmUnsupportedError(f"shm {op}: reduce op {name} is not supported (dtype {t.dtype})",
                                  rank=self._rank, op=op)

    def _fallback(self) -> dist.ProcessGroup:
        """The inner gloo group for what shm does not implement (created by the first such call,
        which every rank makes since it is a collective)."""
        if self._gloo is None:
            # StridedSafeGloo, not a raw ProcessGroupGloo: torch 2.13's gloo writes wrong elements for
            # strided views (pytorch/pytorch#192920) and refuses with untyped errors (hal/emulation/gloo_group.py)
            from hal.emulation.gloo_group import StridedSafeGloo
            self._gloo = StridedSafeGloo(dist.PrefixStore("hal_shm_gloo", self._store), self._rank,
                                         self._size, self._timeout)
        return self._gloo

    @staticmethod
    def _contig(t: torch.Tensor) -> torch.Tensor:
        return t if t.is_contiguous() else t.contiguous()

    # ---- collectives ------------------------------------------------------------------------
    def allreduce(self, tensors: list, opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else _DEFAULT_ALLREDUCE
        if len(tensors) != 1 or tensors[0].dtype not in DTYPE_CODES:
            return self._fallback().allreduce(tensors, opts)
        t = tensors[0]
        if not t.is_cpu:
            self._cpu(t, "all_reduce")
        op = self._redop(opts, t, "all_reduce")
        buf = t if t.is_contiguous() else t.contiguous()
        self._issue(self._comm.allreduce, buf.data_ptr(), buf.numel(), DTYPE_CODES[t.dtype], op)
        if buf is not t:
            t.copy_(buf)
        return _DoneWork(tensors)

    def allreduce_coalesced(self, tensors: list, opts: Any = None) -> dist.Work:
        o = dist.AllreduceOptions()
        if opts is not None:
            o.reduceOp = opts.reduceOp
        for t in tensors:
            self.allreduce([t], o)
        return _done(tensors)

    def broadcast(self, tensors: list, opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.BroadcastOptions()
        if len(tensors) != 1:
            return self._fallback().broadcast(tensors, opts)
        t = tensors[0]
        self._cpu(t, "broadcast")
        buf = self._contig(t)
        self._issue(self._comm.broadcast, buf.data_ptr(), buf.numel() * buf.element_size(), opts.rootRank,
                             DTYPE_CODES.get(t.dtype, BYTES_CODE))
        if buf is not t:
            t.copy_(buf)
        return _done(tensors)

    def _contig_per_rank(self, tensors: list, like: torch.Tensor, op: str, are: str, like_is: str) -> list:
        """The tensor-list collectives: one tensor a rank, each of `like`'s dtype and size, on the CPU;
        returned contiguous. `are`/`like_is` name them in errors ("output", "input")."""
        if len(tensors) != self._size:
            raise ShmMismatchError(f"shm {op}: {len(tensors)} {are} tensors for {self._size} ranks",
                                   rank=self._rank, op=op)
        bufs = []
        for r, t in enumerate(tensors):
            if t.dtype != like.dtype or t.numel() != like.numel():
                raise ShmMismatchError(f"shm {op}: {are} {r} is {t.dtype} x {t.numel()} but the {like_is} is "
                                       f"{like.dtype} x {like.numel()}", rank=self._rank, op=op)
            self._cpu(t, op)
            bufs.append(self._contig(t))
        return bufs

    def _gather_into(self, outs: list, inp: torch.Tensor, op: str) -> None:
        self._cpu(inp, op)
        src = self._contig(inp)
        nbytes = src.numel() * src.element_size()
        bufs = self._contig_per_rank(outs, inp, op, "output", "input")
        self._issue(self._comm.allgather, [b.data_ptr() for b in bufs], src.data_ptr(), nbytes,
                             DTYPE_CODES.get(inp.dtype, BYTES_CODE))
        for o, b in zip(outs, bufs):
            if b is not o:
                o.copy_(b)

    def allgather(self, output_tensors: list, input_tensors: list, opts: Any = None) -> dist.Work:
        if len(input_tensors) != 1 or len(output_tensors) != 1:
            return self._fallback().allgather(output_tensors, input_tensors, opts or dist.AllgatherOptions())
        self._gather_into(output_tensors[0], input_tensors[0], "all_gather")
        return _done(output_tensors)

    def _check_whole(self, output: torch.Tensor, input: torch.Tensor, op: str, gather: bool) -> None:
        """The tensor-in-tensor collectives: all-gather's output (`gather`) or reduce-scatter's input is
        world-size times the other, of its dtype; both on the CPU."""
        whole, part, whole_is, part_is = ((output, input, "output", "input") if gather else
                                          (input, output, "input", "output"))
        if whole.numel() != part.numel() * self._size or whole.dtype != part.dtype:
            raise ShmMismatchError(f"shm {op}: {whole_is} {whole.dtype} x {whole.numel()} must be "
                                   f"{self._size} x the {part_is} ({part.dtype} x {part.numel()})",
                                   rank=self._rank, op=op)
        if not (output.is_cpu and input.is_cpu):
            self._cpu(output if not output.is_cpu else input, op)

    def _chunk_ptrs(self, whole: torch.Tensor, part: torch.Tensor) -> list[int]:
        """Addresses of the world-size chunks of contiguous `whole`, each the bytes of `part`."""
        nbytes = part.numel() * part.element_size()
        return [whole.data_ptr() + r * nbytes for r in range(self._size)]

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        self._check_whole(output, input, "all_gather_into_tensor", gather=True)
        buf, src = self._contig(output), self._contig(input)
        self._issue(self._comm.allgather, self._chunk_ptrs(buf, src), src.data_ptr(),
                    src.numel() * src.element_size(), DTYPE_CODES.get(input.dtype, BYTES_CODE))
        if buf is not output:
            output.copy_(buf)
        return _DoneWork([output])

    _allgather_base = all_gather_single
    all_gather_single_coalesced = allgather_into_tensor_coalesced = _one_by_one(all_gather_single)

    def _reduce_scatter_into(self, out: torch.Tensor, ins: list, opts: Any, op: str) -> None:
        self._cpu(out, op)
        code = self._redop(opts, out, op)
        srcs = self._contig_per_rank(ins, out, op, "input", "output")
        buf = self._contig(out)
        self._issue(self._comm.reduce_scatter, buf.data_ptr(), [s.data_ptr() for s in srcs], out.numel(),
                                  DTYPE_CODES[out.dtype], code)
        if buf is not out:
            out.copy_(buf)

    def reduce_scatter(self, output_tensors: list, input_tensors: list, opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        if len(output_tensors) != 1 or len(input_tensors) != 1 or output_tensors[0].dtype not in DTYPE_CODES:
            return self._fallback().reduce_scatter(output_tensors, input_tensors, opts)
        self._reduce_scatter_into(output_tensors[0], input_tensors[0], opts, "reduce_scatter")
        return _done(output_tensors)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        op = "reduce_scatter_tensor"
        opts = opts if opts is not None else _DEFAULT_REDUCE_SCATTER
        if output.dtype not in DTYPE_CODES:
            return self._fallback()._reduce_scatter_base(output, input, opts)
        self._check_whole(output, input, op, gather=False)
        code = self._redop(opts, output, op)
        src, buf = self._contig(input), self._contig(output)
        self._issue(self._comm.reduce_scatter, buf.data_ptr(), self._chunk_ptrs(src, buf),
                    buf.numel(), DTYPE_CODES[output.dtype], code)
        if buf is not output:
            output.copy_(buf)
        return _DoneWork([output])

    _reduce_scatter_base = reduce_scatter_single
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced = _one_by_one(reduce_scatter_single)

    def _alltoall(self, outs: list, ins: list, op: str) -> None:
        if len(outs) != self._size or len(ins) != self._size:
            raise ShmMismatchError(f"shm {op}: {len(ins)} inputs and {len(outs)} outputs for {self._size} ranks",
                                   rank=self._rank, op=op)
        dtype = ins[0].dtype if ins else outs[0].dtype
        for t in list(outs) + list(ins):
            self._cpu(t, op)
            if t.dtype != dtype:
                raise ShmMismatchError(f"shm {op}: mixed dtypes {t.dtype} and {dtype}", rank=self._rank, op=op)
        src = [self._contig(t) for t in ins]
        dst = [self._contig(t) for t in outs]
        self._issue(self._comm.alltoall, [t.data_ptr() for t in dst], [t.numel() * t.element_size() for t in dst],
                            [t.data_ptr() for t in src], [t.numel() * t.element_size() for t in src],
                            DTYPE_CODES.get(dtype, BYTES_CODE))
        for o, b in zip(outs, dst):
            if b is not o:
                o.copy_(b)

    def alltoall(self, output_tensors: list, input_tensors: list, opts: Any = None) -> dist.Work:
        self._alltoall(output_tensors, input_tensors, "all_to_all")
        return _done(output_tensors)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list,
                          input_split_sizes: list, opts: Any = None) -> dist.Work:
        op = "all_to_all_single"
        if output.dtype != input.dtype:
            raise ShmMismatchError(f"shm {op}: output is {output.dtype} but input is {input.dtype}",
                                   rank=self._rank, op=op)
        for t in (output, input):
            self._cpu(t, op)

        def layout(t: torch.Tensor, sizes: list, what: str) -> tuple[list, list]:
            """Byte offsets and lengths of the per-rank blocks (split along dim 0, in rows)."""
            rows = t.shape[0] if t.dim() else t.numel()
            if not sizes:
                if rows % self._size:
                    raise ShmMismatchError(f"shm {op}: {what} has {rows} rows, not divisible by {self._size} "
                                           f"ranks (give split sizes)", rank=self._rank, op=op)
                sizes = [rows // self._size] * self._size
            if len(sizes) != self._size or sum(sizes) != rows or min(sizes) < 0:
                raise ShmMismatchError(f"shm {op}: {what} split sizes {list(sizes)} must be {self._size} "
                                       f"non-negative numbers summing to {rows}", rank=self._rank, op=op)
            row_bytes = (t.numel() // rows if rows else 0) * t.element_size()
            offsets, lengths, at = [], [], 0
            for k in sizes:
                offsets.append(at)
                lengths.append(k * row_bytes)
                at += k * row_bytes
            return offsets, lengths

        out = output if output.is_contiguous() else output.contiguous()
        src = input if input.is_contiguous() else input.contiguous()
        out_off, out_len = layout(out, output_split_sizes, "output")
        in_off, in_len = layout(src, input_split_sizes, "input")
        ob, ib = out.data_ptr(), src.data_ptr()
        self._issue(self._comm.alltoall, [ob + o for o in out_off], out_len, [ib + o for o in in_off], in_len,
                    DTYPE_CODES.get(input.dtype, BYTES_CODE))
        if out is not output:
            output.copy_(out)
        return _DoneWork([output])

    alltoall_base = all_to_all_single

    def barrier(self, opts: Any = None) -> dist.Work:
        self._issue(self._comm.barrier)
        return _done([])

    # ---- point to point ---------------------------------------------------------------------
    def _reap(self) -> None:
        with self._p2p_lock:
            for op_id in [i for i in self._inflight if self._comm.test(i)]:
                self._inflight.pop(op_id, None)

    def _post(self, t: torch.Tensor, op: str, post: Callable[..., int], peer: int,
              tag: int) -> tuple[int, torch.Tensor]:
        """Post a send or recv of `t` with `peer` to the engine thread: its op id and the contiguous
        buffer, kept alive in `_inflight` until the op is done."""
        self._cpu(t, op)
        buf = self._contig(t)
        self._reap()
        op_id = post(buf.data_ptr(), buf.numel() * buf.element_size(), peer, tag)
        with self._p2p_lock:
            self._inflight[op_id] = [buf]
        return op_id, buf

    def send(self, tensors: list, dstRank: int, tag: int = 0) -> dist.Work:
        op_id, _ = self._post(tensors[0], "send", self._comm.post_send, dstRank, tag)
        return _P2PWork(self, op_id, tensors)

    def recv(self, tensors: list, srcRank: int, tag: int = 0) -> dist.Work:
        t = tensors[0]
        op_id, buf = self._post(t, "recv", self._comm.post_recv, srcRank, tag)
        return _P2PWork(self, op_id, tensors, copy_back=(t, buf) if buf is not t else None)

    def recv_anysource(self, tensors: list, tag: int = 0) -> dist.Work:
        raise ShmUnsupportedError("shm recv: receiving from any source is not supported; name the source rank",
                                  rank=self._rank, op="recv")

    # ---- explicit gloo fallbacks ------------------------------------------------------------
    def gather(self, output_tensors: list, input_tensors: list, opts: Any = None) -> dist.Work:
        return self._fallback().gather(output_tensors, input_tensors, opts or dist.GatherOptions())

    def scatter(self, output_tensors: list, input_tensors: list, opts: Any = None) -> dist.Work:
        return self._fallback().scatter(output_tensors, input_tensors, opts or dist.ScatterOptions())

    def reduce(self, tensors: list, opts: Any = None) -> dist.Work:
        return self._fallback().reduce(tensors, opts or dist.ReduceOptions())

    def allgather_coalesced(self, output_lists: list, input_list: list, opts: Any = None) -> dist.Work:
        return self._fallback().allgather_coalesced(output_lists, input_list, opts or dist.AllgatherOptions())

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        return self._fallback().monitored_barrier(timeout or self._timeout, wait_all_ranks)

    # ---- lifetime ---------------------------------------------------------------------------
    def abort(self) -> None:
        if not isinstance(self._comm, _Closed):
            self._comm.abort(f"rank {self._rank} called abort()")
        self.shutdown()

    def shutdown(self) -> None:
        comm, self._comm = self._comm, _Closed(self._rank)
        if not isinstance(comm, _Closed):
            comm.close()


class _Closed:
    """Stands in for the communicator after shutdown: every call raises a typed error."""

    def __init__(self, rank: int):
        self._rank = rank
        self.segment_bytes = 0

    def __getattr__(self, name: str) -> Any:
        from hal.emulation.shm.errors import ShmAbortedError

        def closed(*args: Any, **kwargs: Any) -> Any:
            raise ShmAbortedError(f"shm {name}: the group was shut down", rank=self._rank, op=name)
        return closed
