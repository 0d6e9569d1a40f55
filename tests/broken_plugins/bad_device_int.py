"""Broken plugin: runtime.device(i) returns the bare int index instead of a torch.device, the
DeepSpeed-accelerator bug: torch reads a bare int as a CUDA device index."""
import hal

from ._base import install

BUG = "runtime.device(i) returns a bare int"
CAUGHT_BY = "runtime.device_selection"
LEVELS = ["runtime"]
SELECT = ["runtime.device_selection", "runtime.device_count"]
STILL_PASSES = ["runtime.device_count"]


class Runtime(hal.CpuRuntime):
    def device(self, index=None):
        if index is None:
            return super().device()  # the accelerator's own device is right; explicit indices are not
        return index  # the bug


install(globals(), "bad_device_int", BUG, runtime=Runtime)
