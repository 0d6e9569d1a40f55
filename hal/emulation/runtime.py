"""Runtimes on host tensors: `CpuRuntime` (the `cpu` chip, a vendor chip whose device type is `cpu`)
and `EmulatedRuntime` (every emulated chip; slowed by a timed clock or by dilation)."""
from __future__ import annotations

import os
import time
from typing import Any, Optional

import torch

from hal.contract.runtime import DeviceRuntime


class CpuStream:
    """A stream on the host: work runs eagerly in issue order, so a stream is always idle."""

    def __init__(self, device: Any = None, priority: int = 0):
        self.device = torch.device("cpu")
        self.priority = priority

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def wait_event(self, event: "CpuEvent") -> None:
        event.synchronize()

    def wait_stream(self, stream: "CpuStream") -> None:
        return None

    def record_event(self, event: Optional["CpuEvent"] = None) -> "CpuEvent":
        event = event or CpuEvent()
        event.record(self)
        return event

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class CpuEvent:
    """An event on the host: recording marks the time; everything before it has already run."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing
        self._t: Optional[float] = None

    def record(self, stream: Optional[CpuStream] = None) -> None:
        self._t = time.perf_counter()

    def query(self) -> bool:
        return self._t is not None

    def synchronize(self) -> None:
        return None

    def wait(self, stream: Optional[CpuStream] = None) -> None:
        return None

    def elapsed_time(self, end: "CpuEvent") -> float:
        """Milliseconds between this event and `end`, like torch.cuda.Event.elapsed_time."""
        if self._t is None or end._t is None:
            raise RuntimeError("elapsed_time: both events must be recorded first")
        return (end._t - self._t) * 1e3


_CURRENT_CPU_STREAM = CpuStream()


def _read_proc(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


class CpuRuntime(DeviceRuntime):
    """The host as a device. Memory figures are the process's resident set (Linux /proc), since
    torch's CPU allocator keeps no statistics; `get_memory_info` is MemAvailable/MemTotal."""

    device_type = "cpu"
    Stream = CpuStream
    Event = CpuEvent

    def __init__(self) -> None:
        self._peak = 0
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def device_count(self) -> int:
        return 1

    def current_device_index(self) -> int:
        return 0

    def set_device_index(self, index: int) -> None:
        # Every local rank shares the host: any index names it.
        if index < 0:
            raise ValueError(f"device index must be >= 0, got {index}")

    def device(self, index: Optional[int] = None) -> torch.device:
        return torch.device("cpu")

    def synchronize(self, index: Optional[int] = None) -> None:
        return None

    def current_stream(self) -> CpuStream:
        return _CURRENT_CPU_STREAM

    def memory_allocated(self) -> int:
        text = _read_proc("/proc/self/statm")
        rss = int(text.split()[1]) * self._page if text else 0
        self._peak = max(self._peak, rss)
        return rss

    def max_memory_allocated(self) -> int:
        return max(self._peak, self.memory_allocated())

    def memory_reserved(self) -> int:
        return self.memory_allocated()

    def reset_peak_memory_stats(self) -> None:
        self._peak = 0

    def memory_stats(self) -> dict[str, Any]:
        cur = self.memory_allocated()
        return {"allocated_bytes.all.current": cur, "allocated_bytes.all.peak": self.max_memory_allocated(),
                "source": "process resident set size (/proc/self/statm)"}

    def get_memory_info(self) -> tuple[int, int]:
        text = _read_proc("/proc/meminfo") or ""
        info = {}
        for line in text.splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                info[key] = int(parts[0]) * 1024
        total = info.get("MemTotal", 0)
        return info.get("MemAvailable", total), total

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        # Pinning needs an accelerator runtime; on a CPU-only build a host tensor is already
        # where a copy engine would read it from.
        if torch.cuda.is_available():
            return tensor.pin_memory()
        return tensor.contiguous()


class TimedEvent(CpuEvent):
    """An event on a timed-emulated chip: it records where the emulated device's work ends (the
    virtual clock's device_t), so `elapsed_time` between two events is the emulated device's time;
    `synchronize` waits (sleeps) until the device reaches the event. `EmulatedRuntime` makes a
    subclass per clock (`Event`), so events are made like torch.cuda.Event(enable_timing=True)."""

    _clock: Any = None

    def record(self, stream: Optional[CpuStream] = None) -> None:
        self._t = self._clock.device_time()

    def query(self) -> bool:
        return self._t is not None and time.perf_counter() >= self._t

    def synchronize(self) -> None:
        if self._t is not None:
            self._clock.sync(until=self._t)


class EmulatedRuntime(CpuRuntime):
    """A chip emulated on the host, optionally slowed to the chip's speed: by a timed clock or by dilation.

    `clock` (a `hal.emulation.timed.VirtualClock`, HAL_EMULATE_TIMED=1): every op is charged to the clock and
    `synchronize()` sleeps until the emulated device has finished what it was charged (hal.emulation.timed);
    events record the device's time. With `dilation` d > 1 instead (HAL_EMULATE_DILATION=1),
    `synchronize()` sleeps (d - 1) x the process CPU time used since the last synchronize, so a chip
    with a fraction 1/d of another's peak takes about d times the wall time on an idle host (not under
    contention: CPU time then understates the wall time a step takes). The two are exclusive.
    """

    def __init__(self, chip: str, dilation: float = 1.0, clock: Any = None) -> None:
        super().__init__()
        if dilation < 1.0:
            raise ValueError(f"emulation dilation for chip {chip!r} must be >= 1, got {dilation}")
        if clock is not None and dilation != 1.0:
            from hal.emulation.timed import TimedEmulationError
            raise TimedEmulationError(f"chip {chip!r}: timed emulation (a clock) and dilation {dilation} are "
                                      f"exclusive; use one (HAL_EMULATE_TIMED or HAL_EMULATE_DILATION)")
        self.chip = chip
        self.dilation = dilation
        self.clock = clock
        self._last_cpu = time.process_time()
        if clock is not None:
            self.synchronize = self._timed_synchronize  # type: ignore[method-assign]
            self.Event = type("TimedEvent", (TimedEvent,), {"_clock": clock})  # type: ignore[assignment]
        elif dilation > 1.0:
            self.synchronize = self._dilated_synchronize  # type: ignore[method-assign]

    def _timed_synchronize(self, index: Optional[int] = None) -> None:
        self.clock.sync()

    def _dilated_synchronize(self, index: Optional[int] = None) -> None:
        now = time.process_time()
        used, self._last_cpu = now - self._last_cpu, now
        if used > 0:
            time.sleep(used * (self.dilation - 1.0))
        self._last_cpu = time.process_time()
