"""Level `runtime`: the bound chip's device runtime (devices, streams and events, memory, RNG).

Run on rank 0 of the pool through `hal.accelerator()`'s bound attributes (what training code uses).
Every check states what it expected; the event and stream checks are written so that a device that
really runs work asynchronously is tested for real (a long matmul chain is in flight when the
event is recorded), and a host runtime (work already done when a call returns) passes them.
"""
from __future__ import annotations

from typing import Callable

from ..bounds import multi_rank_timeout
from ..checks import Check, CheckFailed, CheckSkipped, Where


def _busy(acc, n: int = 256, reps: int = 8):
    """Queue a chain of matmuls on the current stream; returns (result tensor, its expected sum)."""
    import torch
    x = torch.full((n, n), 1.0 / n, device=acc.device)
    y = x
    for _ in range(reps):
        y = y @ x  # stays the matrix of 1/n: the sum is n exactly
    return y, float(n)


def check_device_count(ctx) -> str:
    """A prerequisite: the count is an int >= 1 and real: every counted device can be selected and
    used (every rank picks LOCAL_RANK % device_count(), so a phantom device is one some rank binds)."""
    import torch
    acc = ctx.acc
    count = acc.device_count()
    if not isinstance(count, int) or count < 1:
        raise CheckFailed(f"device_count() returned {count!r}, expected an int >= 1")
    start = acc.current_device_index()
    try:
        for i in range(count):
            try:
                acc.set_device_index(i)
                torch.ones(1, device=acc.runtime.device()).sum().item()  # a tensor on the current device
            except Exception as exc:
                raise CheckFailed(f"device_count() = {count}, but device {i} cannot be used: "
                                  f"set_device_index({i}) then a tensor on it raised {type(exc).__name__}: {exc}: "
                                  f"the count includes a device that does not exist (over-reported?); ranks bind "
                                  f"LOCAL_RANK % device_count(), so a rank would bind it") from None
    finally:
        try:
            acc.set_device_index(start)
        except Exception:  # reported above
            pass
    return f"device_count() = {count}; each can be selected and holds a tensor"


def check_rank_devices(ctx) -> str:
    """A prerequisite: every rank of the pool bound the chip on its own device (LOCAL_RANK % count)."""
    import os

    import torch
    acc = ctx.acc
    count, local = acc.device_count(), int(os.environ.get("LOCAL_RANK", ctx.rank))
    want, got = local % max(count, 1), acc.current_device_index()
    if got != want:
        raise CheckFailed(f"LOCAL_RANK {local} with device_count() = {count} should be on device {want}, "
                          f"current_device_index() is {got}")
    t = torch.ones(2, device=acc.device)
    if t.device.type != acc.runtime.device_type or float(t.sum().item()) != 2.0:
        raise CheckFailed(f"a tensor made on {acc.device} lives on {t.device} or holds the wrong values")
    return f"every rank bound its device (LOCAL_RANK % device_count() = {count})"


def check_process_group(ctx) -> str:
    """A prerequisite: the chip's process group forms over every rank of the pool and completes a barrier."""
    pg = ctx.ccl()
    pg.barrier().wait()
    return f"the chip's process group formed over {ctx.world_size} ranks ({type(pg).__name__}); barrier completed"


def check_device_selection(ctx) -> str:
    import torch
    acc = ctx.acc
    count, start = acc.device_count(), acc.current_device_index()
    want_type = acc.runtime.device_type
    try:
        for i in range(count):
            acc.set_device_index(i)
            got = acc.current_device_index()
            if got != i:
                raise CheckFailed(f"set_device_index({i}) then current_device_index() = {got}, expected {i}")
            dev = acc.runtime.device(i)
            if not isinstance(dev, torch.device):
                raise CheckFailed(f"runtime.device({i}) returned {dev!r} ({type(dev).__name__}), expected a "
                                  f"torch.device (a bare int is read by torch as a CUDA index)")
            if dev.type != want_type:
                raise CheckFailed(f"runtime.device({i}) = {dev}, expected device type {want_type!r}")
    finally:
        acc.set_device_index(start)
    t = torch.ones(3, device=acc.device)
    if t.device.type != want_type:
        raise CheckFailed(f"a tensor made on accelerator().device ({acc.device}) lives on {t.device}")
    return f"{count} device(s) selectable; tensors land on {t.device}"


def check_synchronize(ctx) -> str:
    acc = ctx.acc
    y, want = _busy(acc)
    acc.synchronize()
    got = y.sum().item()
    if abs(got - want) > 1e-3 * want:
        raise CheckFailed(f"after synchronize(), a matmul chain's sum is {got}, expected {want}")
    acc.synchronize(acc.current_device_index())
    return "synchronize() and synchronize(index) return after queued work completes"


def check_event_wait(ctx) -> str:
    acc = ctx.acc
    stream = acc.current_stream()
    y, want = _busy(acc)
    ev = acc.Event()
    ev.record(stream)
    ev.synchronize()
    if not ev.query():
        raise CheckFailed("event.synchronize() returned but event.query() is False: synchronize did not wait for "
                          "the work recorded before the event")
    got = y.sum().item()
    if abs(got - want) > 1e-3 * want:
        raise CheckFailed(f"after event.synchronize(), the result recorded before the event sums to {got}, "
                          f"expected {want}")
    side = acc.Stream()
    y2, _ = _busy(acc)
    ev2 = acc.Event()
    ev2.record(stream)
    side.wait_event(ev2)
    side.synchronize()
    if not ev2.query():
        raise CheckFailed("stream.wait_event(ev) then stream.synchronize() returned, but ev.query() is False: "
                          "the stream did not wait for the event")
    return "event.synchronize() and stream.wait_event() wait for the recorded work"


def check_stream_ordering(ctx) -> str:
    acc = ctx.acc
    main = acc.current_stream()
    side = acc.Stream()
    y, want = _busy(acc)
    side.wait_stream(main)
    with side:
        z = y * 2.0
    done = acc.Event()
    done.record(side)
    done.synchronize()
    got = z.sum().item()
    if abs(got - 2 * want) > 1e-3 * want:
        raise CheckFailed(f"work on a side stream after wait_stream(main) read {got / 2:.6g}, expected the main "
                          f"stream's result {want}: the side stream did not wait")
    ev = acc.Event()
    y3, want3 = _busy(acc)
    ev.record(main)
    side.wait_event(ev)
    with side:
        z3 = y3 + 1.0
    side.synchronize()
    got3 = z3.sum().item()
    expect3 = want3 + z3.numel()
    if abs(got3 - expect3) > 1e-3 * expect3:
        raise CheckFailed(f"side stream after wait_event read a sum of {got3 - z3.numel():.6g}, expected {want3}")
    return "side-stream work ordered after wait_stream and wait_event"


def check_event_timing(ctx) -> str:
    """elapsed_time follows reality, in milliseconds: a chain timed between two events agrees with the
    host's clock around it (the host waits for the end event, so its time bounds the device's from
    above; the chain is long enough that launching it is a small part), and 8x the work reads longer."""
    import math
    import time
    acc = ctx.acc

    def timed(reps: int) -> tuple[float, float]:
        start, end = acc.Event(enable_timing=True), acc.Event(enable_timing=True)
        acc.synchronize()
        t0 = time.perf_counter()
        start.record(acc.current_stream())
        _busy(acc, 256, reps)
        end.record(acc.current_stream())
        end.synchronize()
        wall_ms = (time.perf_counter() - t0) * 1e3
        return start.elapsed_time(end), wall_ms

    timed(4)  # warm-up
    short = timed(4)
    long_ = [timed(32) for _ in range(2)]
    ms, wall = min(long_, key=lambda p: p[1])
    for v in (short[0], ms):
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise CheckFailed(f"elapsed_time between two recorded timing events returned {v!r}, expected a finite "
                              f"number of milliseconds >= 0")
    if ms > 1.5 * wall + 1.0 or ms < 0.1 * wall:
        raise CheckFailed(f"elapsed_time says {ms:.4g} for a matmul chain the host clock timed at {wall:.4g} ms "
                          f"(host wait included): expected milliseconds within [0.1, 1.5] x that; a figure "
                          f"1000x off is in seconds or microseconds")
    if not max(m for m, _ in long_) > short[0]:
        raise CheckFailed(f"elapsed_time did not grow with the work: 8x the matmuls read {ms:.4g} ms, 1x read "
                          f"{short[0]:.4g} ms")
    return (f"elapsed_time {ms:.3f} ms vs {wall:.3f} ms on the host clock for 32 matmuls (milliseconds); "
            f"{short[0]:.3f} ms for 4")


def check_memory_stats(ctx) -> str:
    """memory_allocated() rises by about an allocation's size while it lives (bytes: at least half of
    it, at most twice) and falls back by at least half of it when it is freed."""
    import torch
    acc = ctx.acc
    nbytes = 128 * 2 ** 20
    acc.synchronize()
    before = acc.memory_allocated()
    t = torch.ones(nbytes // 4, dtype=torch.float32, device=acc.device)  # touched: pages are really used
    acc.synchronize()
    during = acc.memory_allocated()
    peak = acc.max_memory_allocated()
    stats = acc.memory_stats()
    del t
    empty = getattr(acc.runtime, "empty_cache", None)
    if callable(empty):
        empty()
    acc.synchronize()
    after = acc.memory_allocated()
    grew, fell = during - before, during - after
    if grew < nbytes // 2:
        raise CheckFailed(f"memory_allocated() went from {before} to {during} bytes (+{grew}) while a "
                          f"{nbytes}-byte tensor was alive; expected it to grow by at least {nbytes // 2}")
    if grew > 2 * nbytes:
        raise CheckFailed(f"memory_allocated() grew by {grew} for a {nbytes}-byte tensor: more than twice its size "
                          f"(not bytes?)")
    if fell < nbytes // 2:
        raise CheckFailed(f"memory_allocated() was {during} with a {nbytes}-byte tensor alive and {after} after it "
                          f"was freed (-{fell}); expected it to fall by at least {nbytes // 2}: a statistic must "
                          f"follow frees as well as allocations")
    if peak < during:
        raise CheckFailed(f"max_memory_allocated() = {peak} < memory_allocated() = {during}")
    if not isinstance(stats, dict):
        raise CheckFailed(f"memory_stats() returned {type(stats).__name__}, expected a dict")
    return (f"memory_allocated() rose by {grew / 2 ** 20:.0f} MiB for a {nbytes // 2 ** 20} MiB tensor and fell by "
            f"{fell / 2 ** 20:.0f} MiB when it was freed; peak {peak}")


def check_memory_info(ctx) -> str:
    free, total = ctx.acc.get_memory_info()
    if not (isinstance(total, int) and isinstance(free, int) and 0 <= free <= total and total > 0):
        raise CheckFailed(f"get_memory_info() returned (free={free!r}, total={total!r}), expected ints with "
                          f"0 <= free <= total and total > 0")
    return f"free {free / 2 ** 30:.1f} GiB of {total / 2 ** 30:.1f} GiB"


def check_pinned_memory(ctx) -> str:
    import torch
    acc = ctx.acc
    src = torch.arange(1 << 16, dtype=torch.float32)
    pinned = acc.pin_memory(src)
    if pinned.device.type != "cpu":
        raise CheckFailed(f"pin_memory() returned a tensor on {pinned.device}, expected host memory")
    if not torch.equal(pinned, src):
        raise CheckFailed("pin_memory() changed the data")
    native_device = acc.runtime.device_type != "cpu"
    if native_device and not pinned.is_pinned():
        raise CheckFailed("pin_memory() returned host memory that is not page-locked (is_pinned() is False)")
    dev = pinned.to(acc.device, non_blocking=True)
    back = torch.empty_like(src)
    back = back.pin_memory() if native_device else back
    back.copy_(dev, non_blocking=True)
    acc.synchronize()
    if not torch.equal(back, src):
        raise CheckFailed("host -> device -> host copies with non_blocking=True, then synchronize(), did not "
                          "round-trip the data")
    return "pinned host copy; async round trip through the device is exact" + (
        "" if native_device else " (host runtime: no page locking needed)")


def check_rng(ctx) -> str:
    import torch
    acc = ctx.acc
    rt = acc.runtime
    dev = acc.device

    def draw():
        return torch.cat([torch.randn(1000, device=dev), torch.rand(1000, device=dev),
                          torch.randint(0, 1 << 20, (1000,), device=dev).float()]).cpu()

    rt.manual_seed(1234)
    a = draw()
    draw()  # advance the generator: a seed must reset it, not just happen to match
    rt.manual_seed(1234)
    b = draw()
    if not torch.equal(a, b):
        n = int((a != b).sum())
        raise CheckFailed(f"manual_seed(1234) twice gave different numbers ({n} of {a.numel()} differ): "
                          f"expected the same seed to give the same numbers")
    rt.manual_seed(4321)
    c = draw()
    if torch.equal(a, c):
        raise CheckFailed("manual_seed(1234) and manual_seed(4321) gave identical numbers: the seed is ignored")
    return "same seed, same numbers (randn, rand, randint); another seed, other numbers"


def check_dtypes(ctx) -> str:
    import torch
    acc = ctx.acc
    names, bad = [], []
    for dt in acc.supported_dtypes():
        try:
            t = torch.zeros(4, dtype=dt, device=acc.device)
            if t.dtype != dt:
                bad.append(f"{dt}: made {t.dtype}")
            names.append(str(dt).removeprefix("torch."))
        except Exception as exc:
            bad.append(f"{dt}: {type(exc).__name__}: {exc}")
    if bad:
        raise CheckFailed("supported_dtypes() lists dtypes the device cannot hold: " + "; ".join(bad))
    if not names:
        raise CheckSkipped("supported_dtypes() is empty")
    return f"tensors of every listed dtype: {', '.join(names)}"


# hal.conformance.checks.PREREQUISITES: they run first; what depends on one that failed is not run
_PREREQUISITES: list[tuple[str, str, Callable, Where]] = [
    ("device_count", "device_count() is an int >= 1 and every counted device can be selected and used",
     check_device_count, "rank0"),
    ("rank_devices", "every rank of the pool binds the chip on its own device (LOCAL_RANK % device_count())",
     check_rank_devices, "all"),
    ("process_group", "the chip's process group forms over every rank of the pool and completes a barrier",
     check_process_group, "all"),
]

_CHECKS = [
    ("device_selection", "set/current device index round-trip; device(i) is a torch.device of the chip's type",
     check_device_selection),
    ("synchronize", "synchronize() waits for queued work", check_synchronize),
    ("event_wait", "event.synchronize() and stream.wait_event() wait for the recorded work", check_event_wait),
    ("stream_ordering", "a side stream ordered by wait_stream / wait_event sees the producer's result",
     check_stream_ordering),
    ("event_timing", "elapsed_time is in milliseconds: it agrees with the host clock and grows with the work",
     check_event_timing),
    ("memory_stats", "memory_allocated() rises by an allocation's bytes and falls when it is freed; peak >= current",
     check_memory_stats),
    ("memory_info", "get_memory_info() gives 0 <= free <= total", check_memory_info),
    ("pinned_memory", "pin_memory() gives page-locked host memory; async copies round-trip", check_pinned_memory),
    ("rng_determinism", "manual_seed: same seed same numbers, another seed other numbers", check_rng),
    ("dtypes", "every dtype in supported_dtypes() can be allocated on the device", check_dtypes),
]


def discover(target) -> list[Check]:
    multi = multi_rank_timeout(target.group_timeout_s)
    return ([Check(f"runtime.{name}", "runtime", doc, fn, where=where, timeout=120.0 if where == "rank0" else multi)
             for name, doc, fn, where in _PREREQUISITES]
            + [Check(f"runtime.{name}", "runtime", doc, fn, where="rank0", timeout=120.0) for name, doc, fn in _CHECKS])
