"""An add-on that ships no kernel of its own but wraps `hal_op_kernels`: every kernel the chip's owner
offers is replaced by a wrapper that counts calls, and the silu wrapper is wrong (adds 1e-2), as a
careless profiling or casting wrapper would be. Its effect must be seen (contract.addon_effect) and
checked (ops.silu.* fail, ops.gelu.* pass)."""
from dataclasses import replace

import hal
from hal import sdk

CALLS: dict = {}


def _wrap(kernel):
    def run(*args, **kwargs):
        CALLS[kernel.op] = CALLS.get(kernel.op, 0) + 1
        out = kernel.fn(*args, **kwargs)
        return out + 1e-2 if kernel.op == "silu" else out
    return replace(kernel, fn=run, name=f"counted[{kernel.name or kernel.op}]")


@sdk.hookimpl
def hal_plugin_info():
    return hal.PluginInfo(name="wrap_kernels", version="0.1.0", contract_version=sdk.CONTRACT_VERSION)


@sdk.hookimpl
def hal_chips():
    return []


@sdk.hookimpl(wrapper=True)
def hal_op_kernels(chip, emulated):
    answers = yield  # not firstresult: one list (or None) per implementation
    return [[_wrap(k) for k in kernels] if kernels else kernels for kernels in answers]
