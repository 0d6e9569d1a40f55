"""hal: the heterogeneous-accelerator abstraction layer (contract, plugins, accelerator, ops)."""
from .selection import Accelerator, accelerator, bind, bound, reset, select_chip
from .capabilities import CapabilityMatrix
from .chips import ChipProfile, ChipSpec, Figure, unknown
from .contract import CONTRACT_VERSION, PluginInfo
from .errors import (ChipSelectionError, ChipUnavailableError, ClusterSpecError, ContractVersionError,
                     DuplicateChipError, HalError, NotSupportedError, PluginHookError,
                     PluginValidationError, ProfileValidationError, UnknownChipError, UnknownOpError)
from .markers import hookimpl, hookspec
from .ops.kernel import OpKernel
from .plugin_manager import PluginManager, get_plugin_manager, set_plugin_manager
from .runtime import CpuRuntime, DeviceRuntime, EmulatedRuntime, TorchDeviceRuntime

__version__ = "0.1.0"

__all__ = [
    "Accelerator", "accelerator", "bind", "bound", "reset", "select_chip", "CapabilityMatrix",
    "ChipProfile", "ChipSpec", "Figure", "unknown", "CONTRACT_VERSION", "PluginInfo", "hookimpl",
    "hookspec", "OpKernel", "PluginManager", "get_plugin_manager", "set_plugin_manager", "CpuRuntime",
    "DeviceRuntime", "EmulatedRuntime", "TorchDeviceRuntime", "ChipSelectionError",
    "ChipUnavailableError", "ClusterSpecError", "ContractVersionError", "DuplicateChipError",
    "HalError", "NotSupportedError", "PluginHookError", "PluginValidationError",
    "ProfileValidationError", "UnknownChipError", "UnknownOpError",
]
