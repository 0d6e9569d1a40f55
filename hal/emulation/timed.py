"""Timed emulation: an emulated chip's compute takes the wall time its figures say, whatever the host's load.

(The cost side, the one definition a planner uses too, is hal.emulation.timed_cost; its names are re-exported
here: `hal.emulation.timed.chip_speeds`, `op_cost`, `charged_flops`, `trace_cost`, ...)

Every aten op a process runs on its (emulated) chip is charged to a per-process `VirtualClock`:

    cost(op) = max(flops(op) x r(op) / F(dtype(op)), bytes(op) / B)      F, B = chip_speeds(chip, ., scale)

    F(d) = the chip's best sustained FLOP/s in dtype d / scale = peak(d) x the best fraction of its
        efficiency matrix (hal.core.chip_matrix: catalog defaults) or the best measured d matmul FLOP/s;
        d = dtype(op), the dtype the op computes in (its first floating-point operand's)
    r = best fraction / the op's fraction in the matrix (a GEMM's by its (m, n, k), fused attention's;
        1 for other ops) x, for a fused SDPA with is_causal, the share of torch's full count its kernel
        does (about 1/2, as FlashAttention counts causal runs): `timed_cost.rate_factor`
    B = memory bytes/s / scale  = catalog memory bandwidth x the matrix's memory fraction (else an
        assumed/default figure, named) or the measured device-copy bandwidth

flops(op): torch.utils.flop_counter's formulas (mm 2mnk, addmm, bmm, baddbmm, convolution and its
backward, scaled-dot-product attention forward and backward, plus the CPU flash-attention kernels
torch's table lacks); every other op counts 0 FLOPs (elementwise work is charged by its bytes).
bytes(op): the sum of the nbytes of its tensor inputs and outputs as the host runs them (a float32
tensor counts 4 bytes an element): an approximation of its memory traffic (no cache reuse, a
broadcast input counted once, an in-place output counted again). Views, metadata queries and bare
allocations (empty, empty_strided) cost nothing. Each op's FLOPs are charged at the rate of the dtype it
computes in on the host (a bfloat16 matmul under autocast at the chip's bfloat16 rate, a float32 one at its
float32 rate: an H100's non-tensor FP32, 67 TFLOP/s); bytes are its tensors' real sizes. A chip with no
figure for an op's dtype (the catalog lists the 910B2's float32 peak as unknown) is a TimedEmulationError
naming chip, op and dtype, not a guess; `HAL_EMULATE_TIMED_DTYPE` re-maps dtypes explicitly
(`timed_cost.charge_plan`: `float32=tf32`, `ascend:float32=bfloat16`, or one `DTYPE` for every op), and the
clock's source names the re-mapping. The clock's `dtype` is the reference dtype (`Speeds.dtype`: bfloat16,
else the first the chip has) that `flops_per_s` and the MFU peak are given in.

Device-stream semantics. Between synchronisation points the host is taken as infinitely fast:
`device_t += cost` per op, whatever the host's own pace. Hard synchronisation (`clock.sync()`,
`runtime.synchronize()`, `event.synchronize()`): the host sleeps until `device_t`; arriving after
it is an overrun when the host fell behind the device while issuing ops (the host is slower than
the emulated chip: counted, summed, warned once per clock; `device_t = now`, so that step took the
host's time), else host-only work (`host_gap_s`). Soft synchronisation (`.item()` =
`aten._local_scalar_dense`, and the issue of every collective / point-to-point op: namespaces
`c10d`, `_c10d_functional`, `c10d_functional`): the host sleeps until `device_t` if it is ahead
(a collective starts when its data is ready on the device); a late host leaves the timeline alone.
A collective's completion is real: the Work it returned notes when it completes (its future's
callback), and then `device_t = max(device_t, completion)`: an async all_reduce overlaps the
device's later work, a recv's data arrives when the sender sent it (the host's `Work.wait()` is
not an op, so no dispatch mode sees it; the completion time stands in for it). When a completion
moves the timeline forward, the device sat idle waiting for it: that idle time is counted by the
kind of op that completed (`stats()["wait_p2p_s"]`: point-to-point send/recv, e.g. a pipeline
stage waiting for its neighbour; `stats()["wait_collective_s"]`: every other collective, waiting
for the data and for the slowest peer), so a step splits into compute (`busy_s`), these waits, and
the host's own time. The time `scale`
makes the emulated chip slower than the host really is (a tiny model's step on an H100 takes
microseconds), so that the host stays ahead.

Collectives of a process group written in Python (ccl_bridge's `hetero` group) never enter the
`c10d::*` ops (torch calls the subclass through pybind), so its methods are wrapped to the same
effect (`watch_process_groups`). A tensor subclass (DTensor) is not charged itself: the plain ops it
runs are. Ops on fake or meta tensors (shape propagation) cost nothing.

Communication is NOT emulated: it runs on the host's real CPU fabric (shm/gloo) and takes its real
time. The dispatch mode is thread-local: it charges ops of the thread that installed it (the main
thread: the training loop, autograd's CPU backward, DDP's hooks); ops on other threads are free.

Turned on for an emulated chip by `HAL_EMULATE_TIMED=1` (hal.core.selection installs it at binding), with
`HAL_EMULATE_TIME_SCALE` (default DEFAULT_TIME_SCALE), `HAL_EMULATE_TIMED_DTYPE` (default: each op at
its own dtype) and `HAL_EMULATE_TIMED_MATRIX` (an efficiency-matrix JSON file or a directory of them). Exclusive
with `HAL_EMULATE_DILATION`.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hal import envs
from hal.contract.chips import ChipProfile
from hal.emulation.timed_cost import (ASSUMED, DEFAULT_DTYPE, DEFAULT_MEMORY_BW,  # noqa: F401 - API
                         Speeds, TimedEmulationError, TraceOp, charge_plan, charged_flops, chip_speeds, op_bytes,
                         op_cost, op_dtype, op_flops, op_shape, rate_factor, trace_cost)
from hal.emulation.timed_cost import _FREE, aten

_log = logging.getLogger(__name__)

# Default time scale (declared in hal.envs): the emulated chip runs this many times slower than the real
# one, so that the host, the dispatch mode's own per-op cost included, stays ahead of the fastest
# catalogued chip (H100) with the trainer's tiny model on 8 ranks of a 2-core host (docs/performance.md,
# "Timed emulation"). A larger model has more device time per host op and can use a smaller scale.
DEFAULT_TIME_SCALE = envs.HAL_EMULATE_TIME_SCALE.default
# An arrival later than device_t by less than this is sleep/wake-up jitter, not an overrun.
OVERRUN_TOLERANCE_S = 2e-4
# stats()["max_host_fraction"] looks at spans between hard synchronisations with at least this much
# device time (shorter ones are a handful of ops, where the host's per-op overhead decides)
MIN_FRACTION_INTERVAL_S = 1e-3


class TimedEmulationOverrunWarning(RuntimeWarning):
    """The host reached a synchronisation point after the emulated chip would have: time is the host's."""


def record_ops(fn: Callable[[], Any]) -> list[tuple[str, int, int]]:
    """Run `fn()` on this thread and return the (op, flops, bytes) that timed emulation charges for it,
    without sleeping (nothing is slowed): price it for any chip with `trace_cost`."""
    clock = VirtualClock("record", Speeds(1.0, 1.0, "record only"), sleep=lambda s: None, record=True)
    with timed(clock):
        fn()
    return clock.trace or []


_SYNC = {aten._local_scalar_dense.default, aten.equal.default, aten.is_nonzero.default}
_COMM_NAMESPACES = {"c10d", "_c10d_functional", "c10d_functional"}
_WAITS = {"wait_tensor"}  # functional collectives' completion: real, not charged
# point-to-point ops (c10d op names; a Python process group's method names): their waits are "p2p"
_P2P = {"send", "recv_", "recv_any_source_", "recv", "recv_anysource"}


# ---- the clock --------------------------------------------------------------------------------------
class VirtualClock:
    """One process's emulated device timeline (`device_t`, in `now()`'s seconds) and its statistics.

    `now` and `sleep` are injectable (tests use a fake clock; nothing in a test sleeps for real)."""

    # statistics since reset_stats()
    _busy: float
    _overrun_s: float
    _slept: float
    _host_gap_s: float
    _host_fraction: float
    _soft_late_s: float
    _waits: dict[str, float]
    _overruns: int
    _ops: int
    _syncs: int
    _flops: float
    _bytes: float

    def __init__(self, chip: str, speeds: Speeds, *, dtype: str = DEFAULT_DTYPE, scale: float = 1.0,
                 now: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep,
                 record: bool = False):
        self.chip, self.speeds, self.dtype, self.scale = chip, speeds, dtype, scale
        # record=True keeps (op, flops, bytes) of every charged op: `trace_cost` prices it at any speeds
        self.trace: Optional[list[tuple[str, int, int]]] = [] if record else None
        self._now, self._sleep = now, sleep
        self._pending: list = []  # (Work or None, completion box, kind) of collectives not yet seen completed
        self._warned = False
        # None until the first charged op: the device is idle from its creation until the host gives
        # it work (the process's start-up is not an overrun).
        self.device_t: Optional[float] = None
        self._interval_start, self._interval_busy = 0.0, 0.0
        self._behind = 0.0  # how far the host fell behind the device while issuing this interval's ops
        self._hard_start = now()  # the last hard synchronisation (max_host_fraction's span starts here)
        self.reset_stats()

    # -- charging ---------------------------------------------------------------------------------
    def charge(self, flops: float, nbytes: float, op: str = "", shape: Optional[tuple] = None,
               dtype: Optional[str] = None) -> float:
        """Advance the device by one op of `flops` FLOPs computing in `dtype` (None: the reference dtype)
        moving `nbytes` bytes; an op of matrix class `shape` (timed_cost.op_shape) costs its FLOPs x
        rate_factor(shape, the speeds' efficiency matrix) at the dtype's rate; returns its seconds."""
        rate = rate_factor(shape, getattr(self.speeds, "matrix", None))
        cost = op_cost(flops * rate, nbytes, self.speeds, dtype, op)
        if self.trace is not None:
            self.trace.append(TraceOp(op, int(flops), int(nbytes), shape, dtype))
        now = self._now()
        if self.device_t is None:
            self._mark(now)
            start = now
        else:
            start = self.device_t
            if now - start > self._behind:  # the device would have gone idle waiting for this op
                self._behind = now - start
        self.device_t = start + cost
        self._interval_busy += cost
        self._busy += cost
        self._ops += 1
        self._flops += flops
        self._bytes += nbytes
        return cost

    def _mark(self, t: float) -> None:
        """The device timeline is reconciled with the host's at `t`: a new interval starts."""
        self.device_t = t
        self._interval_start, self._interval_busy, self._behind = t, 0.0, 0.0

    def _started(self, now: float) -> float:
        """`device_t`, starting the timeline at `now` if nothing was charged yet."""
        if self.device_t is None:
            self._mark(now)
            return now
        return self.device_t

    def device_time(self) -> float:
        """Where the emulated device's work ends, in `now()`'s seconds (an event records this)."""
        self._poll()
        return self._started(self._now())

    def idle(self) -> None:
        """The host knowingly did work outside torch ops (I/O, a checkpoint, data loading) and the
        device sat idle meanwhile: move the device to now if it is behind, without an overrun."""
        self._poll()
        now = self._now()
        if self.device_t is None or now > self.device_t:
            self._mark(now)

    def sync(self, until: Optional[float] = None, soft: bool = False) -> None:
        """The host waits for the device: sleep until `device_t` (or `until`, an earlier point of it).
        Arriving later than that is recorded and the device timeline moves to now: as an overrun
        when the host fell behind the device while it was issuing ops (the host is slower than the
        emulated chip), else as `host_gap_s` (the host stayed ahead while issuing, then did host-only
        work: Python between two collectives, I/O; the device sat idle, as a real one would).

        `soft` (a value read by the host: `.item()`): sleep if the host is ahead, but a late host
        leaves the device timeline alone; the next hard synchronisation (a collective,
        `synchronize()`) settles it. A step's few-hundred-byte ops (AdamW reads its per-parameter
        step counter with `.item()` between them: a host tensor on a real GPU) cost the emulated
        device less than the host's per-op overhead, and would otherwise leak into the timeline."""
        self._poll()
        now = self._now()
        target = self._started(now)  # nothing charged yet: nothing to wait for
        if until is not None and until < target:  # an event: wait for it, nothing else
            if now < until:
                self._sleep(until - now)
                self._slept += until - now
            return
        if soft and now >= target:
            self._soft_late_s += now - target
            return
        if not soft:
            span = target - self._hard_start
            if span >= MIN_FRACTION_INTERVAL_S:
                self._host_fraction = max(self._host_fraction, (now - self._hard_start) / span)
        self._syncs += 1
        if now < target:
            self._sleep(target - now)
            self._slept += target - now
            self._mark(target)  # the wake-up's own lateness is not carried into the timeline
            if not soft:
                self._hard_start = target
            return
        late = now - target
        if late > OVERRUN_TOLERANCE_S:
            if self._behind > OVERRUN_TOLERANCE_S:
                self._overrun(late)
            else:  # the host kept ahead while it issued work, then did host-only work
                self._host_gap_s += late
        self._mark(now)
        if not soft:
            self._hard_start = now

    def completed(self, kind: str = "collective") -> None:
        """A real event the host waited for (a functional collective's `wait_tensor`) just finished:
        the device cannot be earlier than now."""
        self._advance_to(self._now(), kind)

    def issued(self, works: list, kind: str = "collective") -> None:
        """A collective or point-to-point op was issued and returned `works`: when each completes
        (its future's callback notes the time; without a future, the first poll that sees it
        completed), the device cannot be earlier than that: a recv's data, an all_reduce's sum are
        there only then. Until then the device goes on with what the host issues (overlap).
        `kind` ("p2p" or "collective") names what the device waits for when a completion moves it."""
        for w in works:
            box: list = []
            try:
                w.get_future().add_done_callback(lambda _f, box=box, now=self._now: box.append(now()))
            except (RuntimeError, AttributeError):  # a Work without a future: polled
                box = None  # type: ignore[assignment]
            # Keep the Work only when it must be polled: a held Work keeps its process group alive
            # past destroy_process_group, to be torn down at interpreter exit, where a fabric's
            # worker thread can be destroyed unjoined ("terminate called without an active exception")
            self._pending.append((w if box is None else None, box, kind))

    def _advance_to(self, t: float, kind: str = "") -> None:
        if self.device_t is None or t > self.device_t:
            if self.device_t is not None and kind:  # the device sat idle until this completion
                self._waits[kind] = self._waits.get(kind, 0.0) + (t - self.device_t)
            self._mark(t)

    def _poll(self) -> None:
        if self._pending:
            left, latest, kind = [], None, ""
            for w, box, k in self._pending:
                if box:
                    t = box[0]
                elif box is None and _work_done(w):
                    t = self._now()
                else:
                    left.append((w, box, k))
                    continue
                if latest is None or t > latest:
                    latest, kind = t, k
            self._pending = left
            if latest is not None:
                self._advance_to(latest, kind)

    def _overrun(self, late: float) -> None:
        self._overruns += 1
        self._overrun_s += late
        if not self._warned:
            self._warned = True
            msg = (f"timed emulation of {self.chip!r}: the host reached a synchronisation point {late * 1e3:.2f} ms "
                   f"after the emulated chip would have (the host is slower than the chip at time scale "
                   f"{self.scale:g}, or it did work outside torch ops: I/O, data loading; this step took the "
                   f"host's time). Raise HAL_EMULATE_TIME_SCALE, or call clock.idle() after such host work; "
                   f"clock.stats()['overrun_count'] counts them (warned once)")
            _log.warning(msg)
            warnings.warn(msg, TimedEmulationOverrunWarning, stacklevel=3)

    # -- statistics ---------------------------------------------------------------------------------
    def stats(self) -> dict:
        """busy_s (virtual seconds charged), overrun_count/overrun_s, ops, flops, bytes, slept_s, syncs,
        host_gap_s (host time between collectives with no device work in between: real, not an
        overrun), soft_late_s (how late the host was at `.item()` and collective issues, which the
        timeline did not take: see `sync(soft=True)`), max_host_fraction (between two hard synchronisations
        at least MIN_FRACTION_INTERVAL_S apart on the device, e.g. the steps of a loop that calls
        synchronize() per step: when the host got there / when the device did, both from the first;
        below 1: the host stayed ahead, by that factor), wait_p2p_s / wait_collective_s (device idle
        until a point-to-point op / another collective completed: see `issued`),
        and what the clock charges at (chip, dtype, scale, speeds and their source)."""
        return {"busy_s": self._busy, "overrun_count": self._overruns, "overrun_s": self._overrun_s,
                "ops": self._ops, "flops": self._flops, "bytes": self._bytes, "slept_s": self._slept,
                "syncs": self._syncs, "host_gap_s": self._host_gap_s, "max_host_fraction": self._host_fraction,
                "soft_late_s": self._soft_late_s, "wait_p2p_s": self._waits.get("p2p", 0.0),
                "wait_collective_s": self._waits.get("collective", 0.0),
                "chip": self.chip, "dtype": self.dtype, "scale": self.scale,
                "flops_per_s": self.speeds.flops_per_s, "bytes_per_s": self.speeds.bytes_per_s,
                "source": self.speeds.source}

    def reset_stats(self) -> None:
        self._busy = self._overrun_s = self._slept = self._host_gap_s = self._host_fraction = 0.0
        self._soft_late_s = 0.0
        self._waits = {}
        self._overruns = self._ops = self._syncs = 0
        self._flops = self._bytes = 0.0

    def __repr__(self) -> str:
        return f"VirtualClock({self.chip!r}, {self.dtype}, scale {self.scale:g})"


def _work_done(w: Any) -> bool:
    try:
        return bool(w.is_completed())
    except RuntimeError:  # a failed work: it is over
        return True


def _works_in(out: Any) -> list:
    """c10d ops return Works as ScriptObjects (torch 2.13: `c10d.allreduce_` -> (tensors, Work))."""
    items = out if isinstance(out, (list, tuple)) else (out,)
    found = []
    for x in items:
        if isinstance(x, torch.ScriptObject):
            try:
                found.append(torch._C._distributed_c10d.Work.unbox(x))
            except (RuntimeError, AttributeError, TypeError):
                pass
    return found


# ---- the dispatch mode ----------------------------------------------------------------------------
def _meta(out: Any) -> bool:
    first = out[0] if isinstance(out, (list, tuple)) and out else out
    return isinstance(first, torch.Tensor) and first.is_meta


def _is_fake(types: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor
    return any(issubclass(t, FakeTensor) for t in types)


class TimedMode(TorchDispatchMode):
    """Charges every aten op of this thread to `clock`; collectives and `.item()` synchronise."""

    def __init__(self, clock: VirtualClock):
        super().__init__()
        self.clock = clock
        self.pid = os.getpid()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if os.getpid() != self.pid:  # a forked child (a DataLoader worker) inherits the mode: not the chip
            return func(*args, **kwargs)
        if types and any(t is not torch.Tensor and t is not torch.nn.Parameter for t in types):
            if _is_fake(types):  # shape propagation (DTensor's sharding, meta functions): no device work
                return func(*args, **kwargs)
            # A tensor subclass (DTensor, AsyncCollectiveTensor): let it run; the plain ops it runs
            # come back here and are charged, so the subclass-level op is not.
            return NotImplemented
        clock = self.clock
        ns = func.namespace
        if ns in _COMM_NAMESPACES:
            if func._opname in _WAITS:
                out = func(*args, **kwargs)
                clock.completed("collective")
                return out
            # the data the collective sends is ready when the device gets there; a host that is late
            # starts it late, and its completion (real) carries that into the timeline if it must
            clock.sync(soft=True)
            out = func(*args, **kwargs)
            clock.issued(_works_in(out), "p2p" if func._opname in _P2P else "collective")
            return out
        if func in _SYNC:
            clock.sync(soft=True)
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if func in _FREE or func.is_view or ns == "prim" or _meta(out):
            return out  # no kernel on a device (a view, an allocation, shape-only work on meta tensors)
        clock._poll()
        flops = op_flops(func, args, kwargs, out)
        clock.charge(flops, op_bytes(args, kwargs, out), func._opname, op_shape(func, args),
                     op_dtype(args) if flops else None)
        return out


# ---- process-wide installation ----------------------------------------------------------------------
_ACTIVE: list[VirtualClock] = []  # innermost last
_INSTALLED: Optional[TimedMode] = None
_INSTALLED_THREAD: Optional[int] = None


def active_clock() -> Optional[VirtualClock]:
    """The clock charging this process's ops (the innermost `timed()` block, else the installed one)."""
    return _ACTIVE[-1] if _ACTIVE else None


_LOCAL = threading.local()  # .stack: this thread's timed() clocks, innermost last


def _thread_clock() -> Optional[VirtualClock]:
    """The clock charging the calling thread's ops, or None (another thread: nothing is charged)."""
    stack = getattr(_LOCAL, "stack", None)
    if stack:
        return stack[-1]
    if _INSTALLED is not None and threading.get_ident() == _INSTALLED_THREAD:
        return _INSTALLED.clock
    return None


@contextmanager
def timed(clock: VirtualClock) -> Iterator[VirtualClock]:
    """Charge the ops this thread runs inside the block to `clock` (tests; explicit use)."""
    mode = TimedMode(clock)
    _ACTIVE.append(clock)
    stack = _LOCAL.__dict__.setdefault("stack", [])
    stack.append(clock)
    try:
        with mode:
            yield clock
    finally:
        _ACTIVE.remove(clock)
        stack.remove(clock)


# ---- process groups written in Python --------------------------------------------------------------
# A `dist.ProcessGroup` subclass written in Python (ccl_bridge's HeteroProcessGroup) is called by
# torch (dist.all_reduce, DDP's reducer) through pybind's trampoline, not through the `c10d::*` ops,
# so no dispatch mode sees its collectives. Its methods are wrapped instead: the same soft
# synchronisation before the call, the same completion tracking of the Work it returns.
PG_METHODS = ("allreduce", "allreduce_coalesced", "allgather", "allgather_coalesced", "_allgather_base",
              "allgather_into_tensor_coalesced", "reduce_scatter", "_reduce_scatter_base",
              "reduce_scatter_tensor_coalesced", "alltoall", "alltoall_base", "broadcast", "reduce", "gather",
              "scatter", "barrier", "send", "recv", "recv_anysource")


def _timed_method(fn: Callable) -> Callable:
    kind = "p2p" if fn.__name__ in _P2P else "collective"

    def call(self, *args, **kwargs):
        clock = _thread_clock()
        if clock is None:  # not the emulated chip's thread (the group's own executor, another rank's test)
            return fn(self, *args, **kwargs)
        clock.sync(soft=True)
        work = fn(self, *args, **kwargs)
        clock.issued([work] if work is not None else [], kind)
        return work
    call.__name__, call.__qualname__, call.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    call.__wrapped__ = fn  # type: ignore[attr-defined]
    call._hal_timed = True  # type: ignore[attr-defined]
    return call


def watch_process_group_class(cls: type) -> None:
    """Make a Python `dist.ProcessGroup` subclass's collectives synchronisation points of timed
    emulation (idempotent; outside a timed thread the wrappers only call through)."""
    for name in PG_METHODS:
        fn = cls.__dict__.get(name)
        if callable(fn) and not getattr(fn, "_hal_timed", False):
            setattr(cls, name, _timed_method(fn))


def watch_process_groups() -> list[type]:
    """Wrap every Python subclass of `dist.ProcessGroup` defined so far; returns them."""
    import torch.distributed as dist
    if not dist.is_available():
        return []
    found, todo = [], list(dist.ProcessGroup.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if any(callable(cls.__dict__.get(n)) for n in PG_METHODS):
            watch_process_group_class(cls)
            found.append(cls)
    return found


def install(clock: VirtualClock) -> None:
    """Charge every op of the calling thread to `clock` from now on (hal.core.selection calls it when a
    process binds an emulated chip with HAL_EMULATE_TIMED=1). A second call replaces the clock.
    Python process-group classes defined so far are watched (`watch_process_groups`); one defined
    later should call `watch_process_group_class` itself (ccl_bridge's does not need to: the
    `hetero` group exists before any rank binds its chip)."""
    global _INSTALLED, _INSTALLED_THREAD
    watch_process_groups()
    if _INSTALLED is not None:
        old = _INSTALLED.clock
        _INSTALLED.clock = clock
        if old in _ACTIVE:
            _ACTIVE.remove(old)
        _ACTIVE.insert(0, clock)
        return
    mode = TimedMode(clock)
    mode.__enter__()  # pushed on this thread's dispatch-mode stack until uninstall()
    _INSTALLED, _INSTALLED_THREAD = mode, threading.get_ident()
    _ACTIVE.insert(0, clock)


def uninstall() -> None:
    """Stop charging (hal.reset()). The mode is popped if it is still on top of this thread's stack;
    otherwise it stays, charging a detached clock that nothing reads."""
    global _INSTALLED, _INSTALLED_THREAD
    if _INSTALLED is None:
        return
    mode, clock = _INSTALLED, _INSTALLED.clock
    if clock in _ACTIVE:
        _ACTIVE.remove(clock)
    from torch.utils._python_dispatch import _get_current_dispatch_mode
    if threading.get_ident() == _INSTALLED_THREAD and _get_current_dispatch_mode() is mode:
        mode.__exit__(None, None, None)
    else:
        mode.clock = VirtualClock(clock.chip, clock.speeds, dtype=clock.dtype, scale=clock.scale)
    _INSTALLED = _INSTALLED_THREAD = None


# ---- configuration from the environment (declared in hal.envs) -------------------------------------
def timed_requested(env: Optional[Mapping[str, str]] = None) -> bool:
    return envs.HAL_EMULATE_TIMED.get(env, error=TimedEmulationError)


def time_scale(env: Optional[Mapping[str, str]] = None) -> float:
    """HAL_EMULATE_TIME_SCALE: how many times slower than the real chip the emulated one runs."""
    return envs.HAL_EMULATE_TIME_SCALE.get(env, error=TimedEmulationError)


def _matrix_for(path_text: str, chip: str, model: str) -> Any:
    from hal.core.efficiency import load_efficiency_matrix
    p = Path(path_text)
    files = sorted(p.glob("*.json")) if p.is_dir() else [p] if p.is_file() else None
    if files is None:
        raise TimedEmulationError(f"HAL_EMULATE_TIMED_MATRIX={path_text!r}: no such file or directory")
    for f in files:
        try:
            m = load_efficiency_matrix(f)
        except Exception as exc:  # pydantic's ValidationError or bad JSON: name the file
            raise TimedEmulationError(f"HAL_EMULATE_TIMED_MATRIX: {f} is not an efficiency matrix: "
                                      f"{str(exc).splitlines()[0]}") from None
        if m.chip == chip and (m.profile_model == model or len(files) == 1 or p.is_dir()):
            return m
    return None


def clock_from_env(chip: str, profile: ChipProfile, env: Optional[Mapping[str, str]] = None,
                   **clock_kw: Any) -> Optional[VirtualClock]:
    """The clock `HAL_EMULATE_TIMED` asks for on an emulated `chip` with `profile`, or None (off)."""
    if not timed_requested(env):
        return None
    scale = time_scale(env)
    forced, charge_as = charge_plan(envs.HAL_EMULATE_TIMED_DTYPE.text(env), chip, profile.model)
    mpath = envs.HAL_EMULATE_TIMED_MATRIX.text(env)
    matrix = _matrix_for(mpath, chip, profile.model) if mpath else None
    speeds = chip_speeds(profile, forced, scale, matrix=matrix, charge_as=charge_as)
    return VirtualClock(chip, speeds, dtype=speeds.dtype, scale=scale, **clock_kw)
