"""hal_kunlun: KunlunXin XPUs through KunlunXin's CUDA-compatible PyTorch build and XCCL.

Chip `kunlun`: torch device type `cuda`, CCL backend `nccl` (routed to XCCL by the build), visible
devices `XPU_VISIBLE_DEVICES`. Native when `torch_xmlir` imports and torch.cuda sees devices whose
names are not NVIDIA's (see `probe`, which cites the public integrations followed). The build is
torch.cuda underneath, so `KunlunChip` is hal_cuda's `CudaChip` with its own probe, profile notes,
XCCL matrix and group, and kernels. At bind time what was found (adapter version, visible-device
variables, and -- once the HAL selected the device -- that device's name) is recorded in the
profile's notes and in `PLUGIN.chip.last_probe`. Nothing here touches a device before selection.

Kernels: torch.nn.functional's single ops, which KunlunXin's build dispatches to its own kernels.
No vendor-specific fused kernel is offered: KunlunXin's fused ops (kunlun_ops, xtorch_ops in
vLLM-Kunlun) are inference kernels with their own conventions, and we have not checked them against
the HAL semantics on hardware. Attention and AdamW keep the reference until that is done.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from hal import sdk
from hal_cuda import CudaChip

from .probe import probe
from .runtime import KunlunRuntime
from .xccl import create_xccl_process_group, xccl_capabilities

__version__ = "0.1.0"
__all__ = ["CHIP", "KunlunChip", "PLUGIN", "probe", "KunlunRuntime", "xccl_capabilities"]


class KunlunChip(CudaChip):
    """KunlunXin XPUs: torch.cuda of the Kunlun build, XCCL behind `nccl`."""

    spec = sdk.ChipSpec(name="kunlun", vendor="KunlunXin", torch_device_type="cuda", ccl_backend="nccl",
                        ccl_name="XCCL", visible_devices_env="XPU_VISIBLE_DEVICES",
                        description="KunlunXin XPUs via KunlunXin's CUDA-compatible PyTorch build (torch_xmlir) "
                                    "and XCCL")
    version = __version__
    description = "KunlunXin XPUs: torch.cuda of the Kunlun build, XCCL behind `nccl`"
    runtime_class = KunlunRuntime
    profile_dtypes = ("float32", "bfloat16", "float16", "int8")
    kernel_ops = ("rms_norm", "layer_norm", "softmax", "gelu", "silu", "cross_entropy", "embedding", "linear")

    def __init__(self) -> None:
        self.last_probe: Optional[dict[str, Any]] = None  # what the last native bind found

    def probe(self, bind=False):
        found = probe()  # touches no device, also at bind (the device is selected after the runtime exists)
        if bind:
            self.last_probe = found
        return found

    def device_runtime(self):
        return self.runtime_class(torch.cuda, "cuda", on_name=self._seen_name)

    def _seen_name(self, index: int, name: str) -> None:
        if self.last_probe is not None:
            self.last_probe.update(device_index=index, device_name=name)

    def profile(self, model):
        prof = super().profile(model)
        found = self.last_probe
        if model is not None and found is not None and found.get("native"):
            seen = {k: found.get(k) for k in ("adapter_version", "device_index", "device_name",
                                              "XPU_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")}
            prof = prof.model_copy(update={"notes": f"{prof.notes}; detected natively: {seen}".lstrip("; ")})
        return prof

    def create_process_group(self, store, rank, world_size, timeout, global_ranks, group_name):
        return create_xccl_process_group(store, rank, world_size, timeout, global_ranks, group_name, chip=self.name,
                                         backend=self.spec.ccl_backend)

    def collective_capabilities(self):
        return xccl_capabilities(self.name)


CHIP = KunlunChip.spec
PLUGIN = sdk.plugin(KunlunChip)
globals().update(PLUGIN.hookimpls())  # the entry point names this module: pluggy finds the hooks here
