"""The HAL contract: hook specifications a chip plugin implements (contract version in `contract`).

Every hook is prefixed `hal_`. A plugin that provides chips must implement all the chip hooks for
them (marked *required per chip*); `hal_plugin_info` is required of every plugin; `hal_op_kernels` is
optional and may be implemented by any plugin, for any chip (a third-party package can add a faster
kernel for a chip it does not own).

Chip-scoped hooks (`chip` argument) are called only on the plugin that declared the chip, so the
first (and only) non-None result is the answer. They are called at load (validation) and at bind
time, never on a hot path: the accelerator keeps what they return.
"""
from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Optional

from .markers import hookspec

if TYPE_CHECKING:
    import torch.distributed as dist

    from .capabilities import CapabilityMatrix
    from .chips import ChipProfile, ChipSpec
    from .contract import PluginInfo
    from .ops.kernel import OpKernel
    from .runtime import DeviceRuntime


@hookspec(firstresult=True)
def hal_plugin_info() -> "PluginInfo":
    """Say who this plugin is and which contract version it implements. **Required.**

    :returns: a `hal.PluginInfo`. Called once per plugin at registration; a plugin whose
        ``contract_version`` has another major version, or a newer minor one, than
        ``hal.CONTRACT_VERSION`` is refused with `ContractVersionError`.

    Example::

        @hal.hookimpl
        def hal_plugin_info():
            return hal.PluginInfo(name="acme", version="0.1.0", contract_version="1.0")
    """


@hookspec(firstresult=True)
def hal_chips() -> "list[ChipSpec]":
    """Declare the chips this plugin provides. **Required** (may return ``[]`` for a plugin that only
    adds op kernels).

    :returns: a list of `hal.ChipSpec`. A chip name claimed by two plugins refuses the second with
        `DuplicateChipError`. Called once per plugin at registration.

    Example::

        @hal.hookimpl
        def hal_chips():
            return [hal.ChipSpec(name="acme", vendor="Acme", torch_device_type="acme",
                                 ccl_backend="accl", visible_devices_env="ACME_VISIBLE_DEVICES")]
    """


@hookspec(firstresult=True)
def hal_native_available(chip: str) -> Optional[bool]:
    """Tell whether `chip` is natively usable in this process. **Required per chip.**

    :param chip: a chip name this plugin declared.
    :returns: True if the vendor's PyTorch adapter imports and sees at least one device. Must be
        cheap, must not initialise a device context if avoidable, and must not raise: return False
        when the adapter is missing. First result wins (only the owner is asked).

    Example::

        @hal.hookimpl
        def hal_native_available(chip):
            return importlib.util.find_spec("torch_acme") is not None and torch.acme.device_count() > 0
    """


@hookspec(firstresult=True)
def hal_chip_profile(chip: str, model: Optional[str]) -> "Optional[ChipProfile]":
    """Give the `ChipProfile` of `chip`. **Required per chip.**

    :param chip: a chip name this plugin declared.
    :param model: the product name the device reports (``runtime.device_name()``) when bound
        natively, a model named in a cluster spec, or None for the plugin's default profile (used
        at validation and for emulated chips with no model given).
    :returns: a `ChipProfile` (or a dict that validates as one); a profile that does not validate
        refuses the plugin with `ProfileValidationError`. Unknown figures are ``hal.unknown(...)``,
        never invented. First result wins (only the owner is asked).
    """


@hookspec(firstresult=True)
def hal_device_runtime(chip: str) -> "Optional[DeviceRuntime]":
    """Give the native device runtime of `chip`. **Required per chip.**

    Called once, when this process binds `chip` natively (never for an emulated chip: the HAL runs
    those on `hal.runtime.EmulatedRuntime`).

    :returns: a `hal.DeviceRuntime`; for an adapter that mirrors torch.cuda's module functions,
        ``hal.TorchDeviceRuntime(torch.acme, "acme")``. First result wins (only the owner is asked).
    """


@hookspec(firstresult=True)
def hal_create_process_group(chip: str, store: "dist.Store", rank: int, world_size: int,
                             timeout: timedelta) -> "Optional[dist.ProcessGroup]":
    """Create the vendor CCL process group of `chip` for `world_size` ranks. **Required per chip.**

    Called inside a torch.distributed backend creator (the default group may not exist yet), so
    build the group object directly from `store`, never through ``dist.new_group``. Every collective
    of the returned group must time out after `timeout` with an error (never hang). Only called for
    natively bound chips; emulated chips get the HAL's CPU fabric.

    :returns: a ``torch.distributed.ProcessGroup`` or backend object. First result wins.

    Example::

        @hal.hookimpl
        def hal_create_process_group(chip, store, rank, world_size, timeout):
            opts = ProcessGroupNCCL.Options(); opts._timeout = timeout
            return ProcessGroupNCCL(store, rank, world_size, opts)
    """


@hookspec(firstresult=True)
def hal_collective_capabilities(chip: str) -> "Optional[CapabilityMatrix]":
    """Say which collective x dtype x reduce op the vendor CCL of `chip` does natively.
    **Required per chip.**

    The bridge emulates whatever is missing (never silently wrong), and the conformance suite checks
    both directions: a declared combination must be correct, an undeclared one must raise
    `hal.NotSupportedError` or be emulated. State in ``CapabilityMatrix.source`` how you know.
    First result wins (only the owner is asked).
    """


@hookspec
def hal_op_kernels(chip: str, emulated: bool) -> "Optional[list[OpKernel]]":
    """Offer kernels that override HAL ops on `chip`. Optional; any plugin may answer for any chip.

    :param chip: the chip being bound in this process.
    :param emulated: True when `chip` runs emulated on CPU tensors: only return kernels that run on
        CPU tensors then (the vendor's fused kernels need the real device).
    :returns: a list of `hal.OpKernel` (op name, callable with the op's signature, priority); all
        plugins' lists are merged. For each op the highest priority wins; the HAL's reference
        kernel has priority 0 and is always last. An unknown op name refuses the plugin.

    Example::

        @hal.hookimpl
        def hal_op_kernels(chip, emulated):
            if chip == "ascend" and not emulated:
                return [hal.OpKernel("rms_norm", _npu_rms_norm, priority=10)]
    """
