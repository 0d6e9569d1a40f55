"""Stand-in device streams and events with torch.cuda's API (torch/cuda/streams.py, v2.13.0), which
torch_npu mirrors (torch_npu/npu/streams.py @9e73e708): Stream(device, priority) with query,
synchronize, wait_event, wait_stream, record_event; Event(enable_timing, blocking, interprocess)
with record, wait, query, synchronize, elapsed_time.

What the real ones reject, these reject too:
- an event records on the device of its first stream: recording it later on a stream of another
  device raises ("Event device index 0 does not match recording stream's device index 1", the
  check in c10/cuda/CUDAEvent.h `record`);
- `elapsed_time` needs both events created with enable_timing=True and recorded;
- `Stream.wait_event`/`wait_stream` across devices are allowed (as in CUDA).
The current device is per thread. Every call is appended to `model.log` as (thread name, what,
device index), so tests can see which device each bridge thread synchronised on.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional


class DeviceModel:
    """One stand-in device runtime: per-thread current device, default streams, a call log."""

    def __init__(self, device_count: int, on_init: Optional[Callable[[int, str], None]] = None):
        self.device_count = device_count
        self.log: list[tuple[str, str, int]] = []
        self._tls = threading.local()
        self._on_init = on_init or (lambda index, why: None)
        self._lock = threading.Lock()
        model = self

        class Stream:
            def __init__(self, device: Any = None, priority: int = 0):
                self.device_index = model.index(device)
                self.priority = priority
                model.touch(self.device_index, "Stream")

            def query(self) -> bool:
                return True

            def synchronize(self) -> None:
                model.note("Stream.synchronize", self.device_index)

            def wait_event(self, event: "Event") -> None:
                model.note("Stream.wait_event", self.device_index)

            def wait_stream(self, stream: "Stream") -> None:
                self.wait_event(stream.record_event())

            def record_event(self, event: Optional["Event"] = None) -> "Event":
                event = event if event is not None else Event()
                event.record(self)
                return event

            def __repr__(self) -> str:
                return f"<stand-in Stream device={self.device_index}>"

        class Event:
            def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
                self.enable_timing = enable_timing
                self.device_index: Optional[int] = None
                self.recorded = False

            def record(self, stream: Optional[Stream] = None) -> None:
                stream = stream if stream is not None else model.current_stream()
                if self.device_index is not None and self.device_index != stream.device_index:
                    raise RuntimeError(f"Event device index {self.device_index} does not match recording "
                                       f"stream's device index {stream.device_index}.")
                self.device_index = stream.device_index
                self.recorded = True
                model.note("Event.record", stream.device_index)

            def wait(self, stream: Optional[Stream] = None) -> None:
                (stream if stream is not None else model.current_stream()).wait_event(self)

            def query(self) -> bool:
                return True

            def synchronize(self) -> None:
                model.note("Event.synchronize", -1 if self.device_index is None else self.device_index)

            def elapsed_time(self, end: "Event") -> float:
                if not (self.enable_timing and end.enable_timing):
                    raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
                if not (self.recorded and end.recorded):
                    raise RuntimeError("Both events must be recorded before calculating elapsed time.")
                return 0.0

        self.Stream, self.Event = Stream, Event
        self._default: dict[int, Any] = {}

    @property
    def current(self) -> int:
        return getattr(self._tls, "current", 0)

    def set_current(self, index: int) -> None:
        if not 0 <= index < self.device_count:
            raise RuntimeError(f"Invalid device id {index} (stand-in has {self.device_count})")
        self._tls.current = index
        self.touch(index, "set_device")

    def index(self, device: Any) -> int:
        if device is None:
            return self.current
        if isinstance(device, int):
            return device
        idx = getattr(device, "index", None)
        return self.current if idx is None else int(idx)

    def touch(self, index: int, why: str) -> None:
        self._on_init(index, why)

    def note(self, what: str, index: int) -> None:
        with self._lock:
            self.log.append((threading.current_thread().name, what, index))

    def current_stream(self, device: Any = None) -> Any:
        index = self.index(device)
        if index not in self._default:
            self._default[index] = self.Stream(index)
        return self._default[index]
