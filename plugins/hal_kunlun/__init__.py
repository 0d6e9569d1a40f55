"""hal_kunlun: KunlunXin XPUs through KunlunXin's CUDA-compatible PyTorch build and XCCL.

Chip `kunlun`: torch device type `cuda`, CCL backend `nccl` (routed to XCCL by the build), visible
devices `XPU_VISIBLE_DEVICES`. Native when `torch_xmlir` imports and torch.cuda sees devices whose
names are not NVIDIA's (see `probe`, which cites the public integrations followed). At bind time
what was found (adapter version, device names, visible-device variables) is recorded in the
profile's notes and in `LAST_PROBE`.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any, Optional

import torch

import hal

from . import kernels
from .probe import probe
from .runtime import KunlunRuntime
from .xccl import create_xccl_process_group, xccl_capabilities

__version__ = "0.1.0"
__all__ = ["CHIP", "probe", "KunlunRuntime", "xccl_capabilities", "LAST_PROBE"]

CHIP = hal.ChipSpec(name="kunlun", vendor="KunlunXin", torch_device_type="cuda", ccl_backend="nccl",
                    ccl_name="XCCL", visible_devices_env="XPU_VISIBLE_DEVICES",
                    description="KunlunXin XPUs via KunlunXin's CUDA-compatible PyTorch build (torch_xmlir) and XCCL")

LAST_PROBE: Optional[dict[str, Any]] = None  # what the last native bind found


@hal.hookimpl
def hal_plugin_info():
    return hal.PluginInfo(name="kunlun", version=__version__, contract_version=hal.CONTRACT_VERSION,
                          description="KunlunXin XPUs: torch.cuda of the Kunlun build, XCCL behind `nccl`")


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
    prof = catalog.profile_for(chip, model, ("float32", "bfloat16", "float16", "int8"))
    if model is not None and LAST_PROBE is not None and LAST_PROBE.get("native"):
        found = {k: LAST_PROBE.get(k) for k in ("adapter_version", "device_names", "XPU_VISIBLE_DEVICES",
                                                "CUDA_VISIBLE_DEVICES")}
        prof = prof.model_copy(update={"notes": f"{prof.notes}; detected natively: {found}".lstrip("; ")})
    return prof


@hal.hookimpl
def hal_device_runtime(chip):
    global LAST_PROBE
    if chip != CHIP.name:
        return None
    LAST_PROBE = probe(read_names=True)  # the name check needs the runtime up: only at bind
    if not LAST_PROBE["native"]:
        raise hal.ChipUnavailableError(f"plugin 'kunlun', hook 'hal_device_runtime': chip 'kunlun' is not "
                                       f"natively available: {LAST_PROBE['reason']}")
    return KunlunRuntime(torch.cuda, "cuda")


@hal.hookimpl
def hal_create_process_group(chip, store, rank, world_size, timeout: timedelta, global_ranks, group_name):
    if chip != CHIP.name:
        return None
    return create_xccl_process_group(store, rank, world_size, timeout, global_ranks, group_name, chip=chip,
                                     backend=CHIP.ccl_backend)


@hal.hookimpl
def hal_collective_capabilities(chip):
    if chip != CHIP.name:
        return None
    return xccl_capabilities(chip)


@hal.hookimpl
def hal_op_kernels(chip, emulated):
    if chip != "kunlun" or emulated:
        return None
    return kernels.op_kernels()
