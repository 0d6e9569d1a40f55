"""Reusable buffers and host<->device copies for the bridge.

`ScratchPool` hands out typed views of byte buffers kept per (slot, device). A buffer grows to the
largest request seen for its slot and is then reused, so steady-state collectives allocate nothing
(`allocations` counts real allocations; the tests check it stays flat). For a native chip the
rail path's host slots (one per pipeline stage in flight, a chunk's shard each) and the leader
path's slot are reserved when the group is created. Host buffers are pinned
(page-locked) when this rank's chip is a native accelerator, so device<->host copies run
asynchronously on the copy engine; for an emulated chip (CPU tensors) the cross step reads the
tensors where they are and no host copy is made at all.

`DeviceSync` waits for device copies before gloo reads host memory: an event recorded on the chip's
current stream, synchronised by the host (native chips only; a no-op on CPU tensors).
"""
from __future__ import annotations

from typing import Any, Optional

import torch


class ScratchPool:
    def __init__(self, pin: Optional[Any] = None):
        """`pin`: a callable returning a pinned copy of a host tensor (None: do not pin)."""
        self._bufs: dict[tuple, torch.Tensor] = {}  # (slot, device) -> uint8 buffer
        self._pin = pin
        self.allocations = 0
        self.bytes = 0

    def reserve(self, slot: Any, nbytes: int, device: torch.device) -> None:
        """Allocate `slot` up front (at group creation), so the first collectives allocate nothing."""
        self._bytes(slot, nbytes, device)

    def _bytes(self, slot: Any, nbytes: int, device: torch.device) -> torch.Tensor:
        key = (slot, device)
        buf = self._bufs.get(key)
        if buf is None or buf.numel() < nbytes:
            old = buf.numel() if buf is not None else 0
            size = max(nbytes, 2 * old) if old else nbytes
            size = -(-size // 64) * 64  # whole cache lines, and aligned for any dtype's view
            buf = torch.empty(size, dtype=torch.uint8, device=device)
            if self._pin is not None and device.type == "cpu":
                buf = self._pin(buf)
            self._bufs[key] = buf
            self.allocations += 1
            self.bytes += size - old
        return buf

    def get(self, slot: Any, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A 1-D `dtype` view of `numel` elements over the slot's bytes (any dtype shares the slot);
        contents are whatever the slot held before."""
        nbytes = numel * dtype.itemsize
        return self._bytes(slot, nbytes, device)[:nbytes].view(dtype)

    def zeros(self, slot: Any, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        t = self.get(slot, numel, dtype, device)
        t.zero_()
        return t

    def clear(self) -> None:
        self._bufs.clear()


class DeviceSync:
    """Orders host reads after device copies for a native chip; nothing to do for CPU tensors.

    `native` (default: a non-emulated accelerator whose device is not the host) can be forced on, so
    the device path runs against stand-in streams and events where no device exists (the native
    lane's CI half, tests/test_native_lane.py)."""

    def __init__(self, accelerator: Any, native: Optional[bool] = None):
        if native is None:
            native = accelerator is not None and not accelerator.emulated and accelerator.device.type != "cpu"
        self.native = bool(native) and accelerator is not None
        self._acc = accelerator
        # The current device is per thread: remember this rank's (LOCAL_RANK's) to set it on the
        # bridge's own threads, whose default would be device 0.
        self._index = accelerator.current_device_index() if self.native else None

    def bind_thread(self) -> None:
        """Make this rank's device current in the calling thread (the executor's)."""
        if self.native:
            self._acc.set_device_index(self._index)

    def host_ready(self) -> None:
        """Block until every copy issued so far on the current stream has landed."""
        if self.native:
            ev = self._acc.Event()
            ev.record(self._acc.current_stream())
            ev.synchronize()

    def caller_event(self) -> Optional[Any]:
        """An event on the caller's current stream (recorded at submit; the executor waits on it)."""
        if not self.native:
            return None
        ev = self._acc.Event()
        ev.record(self._acc.current_stream())
        return ev
