"""The plugin SDK: everything a chip plugin imports from hal, and the only module it imports from hal.

A plugin writes `from hal import sdk` and uses `sdk.<name>`; nothing else of hal is its business, so
hal may move its internals without breaking a plugin. Names are resolved on first use (PEP 562
module `__getattr__`, as in `hal/__init__.py`): `import hal.sdk` imports neither torch nor the rest of
hal, and a name costs only its own module.

The chip class (`hal.contract.chip`)
- `Chip`: the base class a vendor subclasses: `spec`, `probe`, `native_available`, `profile`,
  `device_runtime`, `create_process_group`, `collective_capabilities`, `op_kernels`, `plugin_info`.
- `plugin(ChipClass)`: the `ChipPlugin` whose `hal_*` hooks call that class; `ChipPlugin.hookimpls()`
  gives them by name, to place in the module the entry point names.
- `ChipPlugin`: that hook object (register it, or its hooks, with pluggy).

The contract (`hal.contract`)
- `hookimpl`: pluggy's marker for hand-written hooks (add-ons, wrappers, overrides).
- `CONTRACT_VERSION`: the contract this hal implements; `PluginInfo`: what `hal_plugin_info` returns.
- `ChipSpec`: a chip kind; `ChipProfile`: a model's figures; `Figure`: one sourced figure;
  `unknown(unit, why)`: a figure nobody published.
- `CapabilityMatrix`: what a CCL does natively; the name tables its entries use: `COLLECTIVES`,
  `REDUCING` (collectives that take a reduce op), `NON_REDUCING`, `DTYPES`, `REDUCE_OPS`, and
  `TORCH_REDUCE_OPS` (name -> `torch.distributed.ReduceOp`), `torch_dtype(name)` / `dtype_name(dtype)`.
- `OpKernel`: a kernel for one HAL op; `OP_NAMES`, `OP_SIGNATURES`: the ops and their signatures.
- `DeviceRuntime`: the runtime interface; `TorchDeviceRuntime(module, type)`: one over a torch.cuda-like
  module; `CpuRuntime()`: the host as a device (a chip on host tensors).
- `check_process_group_args(chip, rank, world_size, timeout, global_ranks, group_name)`: the
  `ValueError`s every `hal_create_process_group` owes its caller; returns (global ranks, group name).
- Errors a plugin raises: `ChipUnavailableError` (no adapter, device or backend), `NotSupportedError`
  (a capability refused), `HalError` (their base).
- Torch range: `TORCH_FLOOR` (the oldest torch the HAL supports, (2, 5)), `torch_problem(vendor, minimum,
  below, source)` (one line saying why this torch is outside a vendor stack's range, or None: call it
  in your probe), `parse_version`, and `TorchVersionError`.

What hal offers plugins
- Catalog (`hal/data/catalog/<chip>.toml`): `profile_for(chip, model, unknown_dtypes)` (the catalogued
  profile of a model or device name, else one of unknowns named after it), `catalog_get(chip, model)`,
  `catalog_match(chip, device_name)` (None when no entry matches).
- The CPU fabric: `create_cpu_process_group(store, rank, world_size, timeout)` (gloo or shared memory,
  as `HAL_CPU_CCL` says), `cpu_ccl()` (which one), `cpu_fabric_capabilities(backend, chip)` (its
  measured matrix), `StridedSafeGloo` (torch's gloo group with strided tensors staged).
- Kernels: `torch_kernels(priority, ops=None)` (torch's single and fused ops as `OpKernel`s, with the
  HAL's semantics), `TORCH_KERNELS` (op -> (function, label)), `reference` (the HAL's reference ops,
  the fallback outside a fused kernel's limits).
- For tools a plugin ships (`hal_cpu.measure_capabilities`): `PluginManager`, `bind(chip, pm=)`.
"""
from __future__ import annotations

import importlib
from typing import Any

# sdk name -> (hal submodule, attribute; None: the submodule itself)
_EXPORTS: dict[str, tuple[str, Any]] = {
    **{n: ("contract.chip", n) for n in ("Chip", "ChipPlugin", "plugin")},
    "hookimpl": ("contract.markers", "hookimpl"),
    **{n: ("contract.version", n) for n in ("CONTRACT_VERSION", "PluginInfo", "check_process_group_args")},
    **{n: ("contract.chips", n) for n in ("ChipSpec", "ChipProfile", "Figure", "unknown")},
    **{n: ("contract.capabilities", n) for n in ("CapabilityMatrix", "COLLECTIVES", "REDUCING", "NON_REDUCING",
                                                 "DTYPES", "REDUCE_OPS", "TORCH_REDUCE_OPS", "torch_dtype",
                                                 "dtype_name")},
    **{n: ("contract.kernel", n) for n in ("OpKernel", "OP_NAMES", "OP_SIGNATURES")},
    **{n: ("contract.runtime", n) for n in ("DeviceRuntime", "TorchDeviceRuntime")},
    "CpuRuntime": ("emulation.runtime", "CpuRuntime"),
    **{n: ("contract.errors", n) for n in ("HalError", "ChipUnavailableError", "NotSupportedError",
                                           "TorchVersionError")},
    **{n: ("contract.compat", n) for n in ("TORCH_FLOOR", "torch_problem", "parse_version")},
    "profile_for": ("core.catalog", "profile_for"),
    "catalog_get": ("core.catalog", "get"),
    "catalog_match": ("core.catalog", "match"),
    "create_cpu_process_group": ("emulation.emulate", "create_cpu_process_group"),
    **{n: ("emulation.cpu_fabric", n) for n in ("cpu_ccl", "cpu_fabric_capabilities")},
    "StridedSafeGloo": ("emulation.gloo_group", "StridedSafeGloo"),
    "torch_kernels": ("ops.torch_kernels", "torch_kernels"),
    "TORCH_KERNELS": ("ops.torch_kernels", "KERNELS"),
    "reference": ("ops.reference", None),
    "PluginManager": ("core.plugin_manager", "PluginManager"),
    "bind": ("core.selection", "bind"),
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    try:
        module, attr = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'hal.sdk' has no attribute {name!r} (a plugin uses only the names "
                             f"hal.sdk exports: {sorted(_EXPORTS)})") from None
    target = importlib.import_module(f"hal.{module}")
    value = target if attr is None else getattr(target, attr)
    globals()[name] = value  # later lookups are plain module attributes
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
