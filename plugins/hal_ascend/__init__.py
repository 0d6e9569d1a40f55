"""hal_ascend: Huawei Ascend NPUs through torch_npu (torch device `npu`) and HCCL (backend `hccl`).

Chip `ascend`: visible devices `ASCEND_RT_VISIBLE_DEVICES`; native when torch_npu imports and
`torch.npu.device_count() > 0`. Profiles from the HAL catalog by the device name torch_npu reports
('Ascend910B2', ...). Process groups are torch_npu's ProcessGroupHCCL with the HAL timeout, HCCL's
own timeouts derived from it (see `hccl`). Op overrides are torch_npu's fused kernels (`kernels`),
offered only when native. Everything follows Ascend/pytorch and Ascend/op-plugin sources cited in
the submodules.
"""
from __future__ import annotations

import sys
from datetime import timedelta
from typing import Optional

import torch

import hal

from . import kernels
from .hccl import apply_hccl_timeouts, create_hccl_process_group, hccl_capabilities, hccl_timeout_env
from .probe import probe
from .runtime import NpuRuntime

__version__ = "0.1.0"
__all__ = ["CHIP", "probe", "NpuRuntime", "hccl_capabilities", "hccl_timeout_env", "apply_hccl_timeouts",
           "current_soc_version"]

CHIP = hal.ChipSpec(name="ascend", vendor="Huawei", torch_device_type="npu", ccl_backend="hccl",
                    ccl_name="HCCL", visible_devices_env="ASCEND_RT_VISIBLE_DEVICES",
                    description="Huawei Ascend NPUs via torch_npu and HCCL")


@hal.hookimpl
def hal_plugin_info():
    return hal.PluginInfo(name="ascend", version=__version__, contract_version=hal.CONTRACT_VERSION,
                          description="Huawei Ascend NPUs: torch_npu runtime, HCCL process groups")


@hal.hookimpl
def hal_chips():
    return [CHIP]


@hal.hookimpl
def hal_native_available(chip):
    if chip != CHIP.name:
        return None  # not ours (an add-on or a pluggy subset may ask any plugin)
    return bool(probe()["native"])


@hal.hookimpl
def hal_chip_profile(chip, model):
    if chip != CHIP.name:
        return None
    from hal.core import catalog  # imported at first use so that importing the plugin stays cheap
    return catalog.profile_for(chip, model, ("float32", "bfloat16", "float16", "int8"))


@hal.hookimpl
def hal_device_runtime(chip):
    if chip != CHIP.name:
        return None
    found = probe()
    if not found["native"]:
        raise hal.ChipUnavailableError(f"plugin 'ascend', hook 'hal_device_runtime': chip 'ascend' is not "
                                       f"natively available: {found['reason']}")
    return NpuRuntime(torch.npu, "npu")


@hal.hookimpl
def hal_create_process_group(chip, store, rank, world_size, timeout: timedelta, global_ranks, group_name):
    if chip != CHIP.name:
        return None
    return create_hccl_process_group(store, rank, world_size, timeout, global_ranks, group_name, chip=chip,
                                     soc_version=current_soc_version())


@hal.hookimpl
def hal_collective_capabilities(chip):
    if chip != CHIP.name:
        return None
    return hccl_capabilities(chip, current_soc_version())


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


@hal.hookimpl
def hal_op_kernels(chip, emulated):
    if chip != "ascend" or emulated:
        return None  # the fused kernels need the NPU; emulated chips use hal_cpu's CPU kernels
    import torch_npu  # bound natively, so it imports (the probe said so)
    # Called at bind time after the accelerator selected this rank's NPU, so these queries read
    # that device (not device 0).
    try:
        name = torch.npu.get_device_name(torch.npu.current_device())
    except Exception:
        name = ""  # unknown product: only the kernels every product has
    return kernels.op_kernels(torch_npu, name, current_soc_version())
