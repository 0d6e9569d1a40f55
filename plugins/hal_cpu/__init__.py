"""hal_cpu: the reference plugin. The host CPU as a chip: torch CPU kernels, gloo (or shm) as its CCL."""
from __future__ import annotations

from datetime import timedelta

import hal
from hal.emulation.emulate import cpu_ccl, cpu_fabric_capabilities, create_cpu_process_group
from hal.ops.torch_kernels import torch_kernels

from .profile import cpu_profile

__version__ = "0.1.0"

CHIP = hal.ChipSpec(name="cpu", vendor="generic", torch_device_type="cpu", ccl_backend="gloo",
                    ccl_name="gloo", visible_devices_env=None,
                    description="host CPU; the reference chip every other plugin is checked against")


@hal.hookimpl
def hal_plugin_info():
    return hal.PluginInfo(name="cpu", version=__version__, contract_version=hal.CONTRACT_VERSION,
                          description="reference plugin: host CPU, torch CPU kernels, gloo CCL")


@hal.hookimpl
def hal_chips():
    return [CHIP]


@hal.hookimpl
def hal_native_available(chip):
    return chip == "cpu"


@hal.hookimpl
def hal_chip_profile(chip, model):
    return cpu_profile(model)


@hal.hookimpl
def hal_device_runtime(chip):
    return hal.CpuRuntime()


@hal.hookimpl
def hal_create_process_group(chip, store, rank, world_size, timeout: timedelta):
    return create_cpu_process_group(store, rank, world_size, timeout)


@hal.hookimpl
def hal_collective_capabilities(chip):
    return cpu_fabric_capabilities(cpu_ccl())


@hal.hookimpl
def hal_op_kernels(chip, emulated):
    # torch's fused CPU kernels run on CPU tensors, so they serve the cpu chip and every emulated
    # chip alike (an emulated chip's tensors live on the host).
    if chip != "cpu" and not emulated:
        return None
    return torch_kernels(priority=1)
