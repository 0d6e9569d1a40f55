"""An add-on whose silu kernel has priority 1, the same as hal_cpu's torch kernels; a tie goes to the plugin registered first (the owner), so installed
it is never dispatched on cpu. contract.addon_effect must say so (the kernel itself is right)."""
import torch

import hal
from hal import sdk


def silu(x):
    return x * torch.sigmoid(x)


@sdk.hookimpl
def hal_plugin_info():
    return hal.PluginInfo(name="shadowed", version="0.1.0", contract_version=sdk.CONTRACT_VERSION)


@sdk.hookimpl
def hal_chips():
    return []


@sdk.hookimpl
def hal_op_kernels(chip, emulated):
    return [sdk.OpKernel(op="silu", fn=silu, priority=1, name="shadowed.silu")] if chip == "cpu" else []
