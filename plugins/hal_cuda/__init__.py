"""hal_cuda: NVIDIA GPUs through torch.cuda and NCCL (torch backend `nccl`).

Chip `cuda`: torch device type `cuda`, CCL backend `nccl`, visible devices `CUDA_VISIBLE_DEVICES`.
Native only on a CUDA build of torch with a GPU visible and no KunlunXin adapter installed (see
`probe`). Profiles come from the HAL catalog by device name (A100/H100/H800/H20 ...), anything else
gets a profile of unknowns. Op overrides are torch's fused CUDA paths, offered only when native.
"""
from __future__ import annotations

from datetime import timedelta

import torch

import hal

from . import kernels
from .nccl import create_nccl_process_group, nccl_capabilities, nccl_version
from .probe import probe
from .runtime import CudaRuntime

__version__ = "0.1.0"
__all__ = ["CHIP", "probe", "CudaRuntime", "nccl_capabilities"]

CHIP = hal.ChipSpec(name="cuda", vendor="NVIDIA", torch_device_type="cuda", ccl_backend="nccl",
                    ccl_name="NCCL", visible_devices_env="CUDA_VISIBLE_DEVICES",
                    description="NVIDIA GPUs via torch.cuda and NCCL")


@hal.hookimpl
def hal_plugin_info():
    return hal.PluginInfo(name="cuda", version=__version__, contract_version=hal.CONTRACT_VERSION,
                          description="NVIDIA GPUs: torch.cuda runtime, NCCL process groups")


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
    return catalog.profile_for(chip, model, ("float32", "tf32", "bfloat16", "float16"))


@hal.hookimpl
def hal_device_runtime(chip):
    if chip != CHIP.name:
        return None
    found = probe()
    if not found["native"]:
        raise hal.ChipUnavailableError(f"plugin 'cuda', hook 'hal_device_runtime': chip 'cuda' is not "
                                       f"natively available: {found['reason']}")
    return CudaRuntime(torch.cuda, "cuda")


@hal.hookimpl
def hal_create_process_group(chip, store, rank, world_size, timeout: timedelta, global_ranks, group_name):
    if chip != CHIP.name:
        return None
    return create_nccl_process_group(store, rank, world_size, timeout, global_ranks, group_name, chip=chip)


@hal.hookimpl
def hal_collective_capabilities(chip):
    if chip != CHIP.name:
        return None
    # Read the NCCL version and the compute capability only once CUDA is initialised (at bind);
    # at validation the conservative matrix (no float8 reductions) is given.
    cc = None
    try:
        if torch.cuda.is_initialized():
            cc = tuple(torch.cuda.get_device_capability())
    except Exception:
        cc = None
    return nccl_capabilities(chip, nccl_version() if cc else None, cc)


@hal.hookimpl
def hal_op_kernels(chip, emulated):
    if chip != "cuda" or emulated:
        return None  # emulated chips run on CPU tensors: hal_cpu's kernels serve them
    return kernels.op_kernels()
