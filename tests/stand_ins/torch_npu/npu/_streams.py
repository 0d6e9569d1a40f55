"""torch.npu.Stream / Event / current_stream for the torch_npu stand-in: the shared stand-in
streams (`_stand_in_streams`), whose use opens a context like any other NPU call."""
from __future__ import annotations

from typing import Any

from _stand_in_streams import DeviceModel  # top-level: the stand-ins folder is on sys.path

from .._state import STATE


class _NpuModel(DeviceModel):
    @property
    def current(self) -> int:
        return STATE.current

    def set_current(self, index: int) -> None:
        STATE.current = index


MODEL = _NpuModel(device_count=64, on_init=lambda index, why: STATE.open_context(index, why))
Stream, Event = MODEL.Stream, MODEL.Event


def current_stream(device: Any = None) -> Any:
    STATE.open_context(MODEL.index(device), "current_stream")
    return MODEL.current_stream(device)
Stream.__module__ = Event.__module__ = "torch_npu.npu"  # where torch_npu defines them
