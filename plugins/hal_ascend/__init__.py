"""hal_ascend: Huawei Ascend NPUs through torch_npu (torch device `npu`) and HCCL (backend `hccl`).

Chip `ascend`: visible devices `ASCEND_RT_VISIBLE_DEVICES`; native when torch_npu imports and
`torch.npu.device_count() > 0`. Profiles from the HAL catalog by the device name torch_npu reports
('Ascend910B2', ...). Process groups are torch_npu's ProcessGroupHCCL with the HAL timeout, HCCL's
own timeouts derived from it and blocking wait on, so a timeout raises in the waiting thread instead
of tearing the process down (see `hccl`). Op overrides are torch_npu's fused kernels (`kernels`),
offered only when native. Everything follows Ascend/pytorch and Ascend/op-plugin sources cited in
the submodules.
"""
from __future__ import annotations

import sys
from typing import Optional

import torch

from hal import sdk

from . import kernels
from .hccl import apply_hccl_timeouts, create_hccl_process_group, hccl_capabilities, hccl_timeout_env
from .probe import probe
from .runtime import NpuRuntime

__version__ = "0.1.0"
__all__ = ["CHIP", "AscendChip", "PLUGIN", "probe", "NpuRuntime", "hccl_capabilities", "hccl_timeout_env",
           "apply_hccl_timeouts", "current_soc_version"]


class AscendChip(sdk.Chip):
    """Huawei Ascend NPUs: torch_npu's runtime, ProcessGroupHCCL, torch_npu's fused kernels."""

    spec = sdk.ChipSpec(name="ascend", vendor="Huawei", torch_device_type="npu", ccl_backend="hccl",
                        ccl_name="HCCL", visible_devices_env="ASCEND_RT_VISIBLE_DEVICES",
                        description="Huawei Ascend NPUs via torch_npu and HCCL")
    version = __version__
    description = "Huawei Ascend NPUs: torch_npu runtime, HCCL process groups"

    def probe(self, bind=False):
        return probe()

    def profile(self, model):
        return sdk.profile_for(self.name, model, ("float32", "bfloat16", "float16", "int8"))

    def device_runtime(self):
        return NpuRuntime(torch.npu, "npu")

    def create_process_group(self, store, rank, world_size, timeout, global_ranks, group_name):
        return create_hccl_process_group(store, rank, world_size, timeout, global_ranks, group_name, chip=self.name,
                                         soc_version=current_soc_version())

    def collective_capabilities(self):
        return hccl_capabilities(self.name, current_soc_version())

    def op_kernels(self, emulated):
        if emulated:
            return None  # the fused kernels need the NPU; emulated chips use hal_cpu's CPU kernels
        import torch_npu  # bound natively, so it imports (the probe said so)
        # Called at bind time after the accelerator selected this rank's NPU, so these queries read
        # that device (not device 0).
        try:
            name = torch.npu.get_device_name(torch.npu.current_device())
        except Exception:
            name = ""  # unknown product: only the kernels every product has
        return kernels.op_kernels(torch_npu, name, current_soc_version())


def current_soc_version() -> Optional[int]:
    """`torch.npu.get_soc_version()` once this process has selected its NPU, else None. Never
    initialises the NPU itself: get_soc_version runs `_lazy_init()`, which opens a context on the
    current device (device 0 before set_device) -- torch_npu/npu/_backends.py @9e73e708."""
    if "torch_npu" not in sys.modules:
        return None
    npu = getattr(torch, "npu", None)
    try:
        if npu is None or not npu.is_initialized():
            return None
        return int(npu.get_soc_version())
    except Exception:
        return None


CHIP = AscendChip.spec
PLUGIN = sdk.plugin(AscendChip)
globals().update(PLUGIN.hookimpls())  # the entry point names this module: pluggy finds the hooks here
