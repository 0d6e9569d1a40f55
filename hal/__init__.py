"""hal: the heterogeneous-accelerator abstraction layer (contract, plugins, accelerator, ops).

The names below are imported on first use (PEP 562 module `__getattr__`), so `import hal` and
`hal --help` cost no `import torch` (about 3 s); `hal.accelerator()`, `hal.hookimpl` and
`from hal import ChipSpec` work as if they were imported here.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> the submodule that defines it (the one definition; hal only re-exports)
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("Accelerator", "accelerator", "bind", "bound", "reset", "select_chip"), "core.selection"),
    "CapabilityMatrix": "contract.capabilities",
    **dict.fromkeys(("ChipProfile", "ChipSpec", "Figure", "unknown"), "contract.chips"),
    **dict.fromkeys(("CONTRACT_VERSION", "PluginInfo"), "contract.version"),
    **dict.fromkeys(("ChipSelectionError", "ChipUnavailableError", "ClusterSpecError", "ContractVersionError",
                     "DuplicateChipError", "HalError", "NotSupportedError", "PluginHookError",
                     "PluginValidationError", "ProfileValidationError", "UnknownChipError", "UnknownOpError"),
                    "contract.errors"),
    **dict.fromkeys(("hookimpl", "hookspec"), "contract.markers"),
    "OpKernel": "contract.kernel",
    **dict.fromkeys(("PluginManager", "get_plugin_manager", "set_plugin_manager"), "core.plugin_manager"),
    **dict.fromkeys(("DeviceRuntime", "TorchDeviceRuntime"), "contract.runtime"),
    **dict.fromkeys(("CpuRuntime", "EmulatedRuntime"), "emulation.runtime"),
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:  # a submodule (`hal.ops`, `hal.core.catalog`, ...), as an eager import made them attributes
        try:
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module 'hal' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups are plain module attributes
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
