"""The HAL contract: hook specifications a chip plugin implements (contract version in `version`).

A chip plugin normally writes none of these by hand: it subclasses `hal.sdk.Chip` and
`hal.sdk.plugin(ChipClass)` implements every hook by calling the class's methods
(`hal.contract.chip`). Add-ons (wrappers, overrides, extra kernels) implement hooks directly with
`@hal.sdk.hookimpl`, as below. Every hook is prefixed `hal_`. A plugin that provides chips must
implement all the chip hooks for them (marked *required per chip*); `hal_plugin_info` and `hal_chips`
are required of every plugin; `hal_op_kernels` is optional.

Each spec's docstring carries three fields the hook table of docs/writing-a-plugin.md is generated
from (`hal.contract.hooktable`, checked by tests/test_hook_table.py): `:required:`, `:when:`,
`:called:` (which plugins pluggy calls) and `:combined:` (how their answers make one result; the
spec's ``firstresult`` marker says whether pluggy stops at the first non-None answer). In short,
all through pluggy (`pm.hook.<name>(...)` or pluggy's ``subset_hook_caller`` of it, so pluggy's
options mean what pluggy's documentation says):

- **chip-scoped hooks** (those with a `chip` argument and ``firstresult=True``: native_available,
  chip_profile, device_runtime, create_process_group, collective_capabilities) go to the owner of
  `chip` plus every plugin that declares no chip (add-ons), never to the owners of other chips. An
  add-on's ``wrapper=True`` / ``hookwrapper=True`` implementations wrap the owner's (for example to
  log every process-group creation), and a ``tryfirst=True`` implementation that returns a non-None
  value answers before the owner (an override). Such an add-on **must return None for chips it does
  not handle**: the first non-None result wins. The owner is only ever asked about its own chips, so
  it need not check `chip` (a `hal.sdk.Chip` does not).
- `hal_plugin_info` and `hal_chips` describe one plugin: each plugin is asked on its own at
  registration (a subset caller holding only that plugin).
- `hal_op_kernels` is *not* chip-scoped and not firstresult: every plugin that implements it --
  owners of other chips included -- is asked for every chip, each through a subset caller that keeps
  the wrappers (so each kernel is attributed to its plugin), and all lists are merged; per op the
  highest priority wins. So any installed plugin can replace any chip's kernels, `hal_cpu`'s CPU
  kernels for `cpu` and the emulated chips included, by offering a higher priority: that is how a
  third party ships a faster kernel, and why the conformance `ops` level checks the kernels as the
  chip dispatches them.

Chip-scoped hooks run at load (validation) and at bind time, never on a hot path: the accelerator
keeps what they return. An exception raised by a hook at load refuses the plugin
(`PluginValidationError` naming plugin and hook); at bind time it becomes `PluginHookError`, except
`hal.HalError` subclasses (e.g. `ChipUnavailableError`), which pass through unchanged.

pluggy passes each implementation only the arguments it declares, so an implementation may take
fewer arguments than the spec (a contract 1.0 `hal_create_process_group` without `global_ranks` and
`group_name` still loads); it may not take arguments the spec does not have.
"""
from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Optional, Sequence

from hal.contract.markers import hookspec

if TYPE_CHECKING:
    import torch.distributed as dist

    from hal.contract.capabilities import CapabilityMatrix
    from hal.contract.chips import ChipProfile, ChipSpec
    from hal.contract.version import PluginInfo
    from hal.contract.kernel import OpKernel
    from hal.contract.runtime import DeviceRuntime


@hookspec(firstresult=True)
def hal_plugin_info() -> "PluginInfo":
    """Say who this plugin is and which contract version it implements. **Required.**

    :required: every plugin
    :when: registration
    :called: each plugin on its own (a subset caller holding only that plugin).
    :combined: none: the plugin's own answer describes it (the first non-None of its implementations).

    Asked of each plugin on its own, once, at registration.

    :returns: a `hal.PluginInfo` (or a dict that validates as one).
    :raises: nothing on purpose; any exception refuses the plugin (`PluginValidationError`). A
        ``contract_version`` with another major version, or a newer minor one, than
        ``hal.CONTRACT_VERSION`` refuses it with `ContractVersionError`.

    Example::

        @sdk.hookimpl
        def hal_plugin_info():
            return sdk.PluginInfo(name="acme", version="0.1.0", contract_version="1.1")
    """
    raise NotImplementedError  # a specification: pluggy never calls it


@hookspec(firstresult=True)
def hal_chips() -> "list[ChipSpec]":
    """Declare the chips this plugin provides. **Required** (``[]`` for a plugin that only adds op
    kernels or wraps other plugins' hooks).

    :required: every plugin (``[]`` for an add-on)
    :when: registration
    :called: each plugin on its own (a subset caller holding only that plugin).
    :combined: none: the plugin's own list declares its chips (the first non-None of its implementations).

    Asked of each plugin on its own, once, at registration.

    :returns: a list of `hal.ChipSpec`.
    :raises: nothing on purpose; any exception refuses the plugin. A chip name another plugin
        already declared refuses this one with `DuplicateChipError`.

    Example::

        @sdk.hookimpl
        def hal_chips():
            return [sdk.ChipSpec(name="acme", vendor="Acme", torch_device_type="acme",
                                 ccl_backend="accl", visible_devices_env="ACME_VISIBLE_DEVICES")]
    """
    raise NotImplementedError  # a specification: pluggy never calls it


@hookspec(firstresult=True)
def hal_native_available(chip: str) -> Optional[bool]:
    """Tell whether `chip` is natively usable in this process. **Required per chip.**

    :required: per chip
    :when: `hal info`, selection, native bind
    :called: the owner of `chip` and every plugin that declares no chip (add-ons); never the owners
        of other chips.
    :combined: the first non-None answer wins (an add-on's ``tryfirst`` answer before the owner's;
        wrappers wrap it).

    :param chip: a chip name the owner declared.
    :returns: True if the vendor's PyTorch adapter imports and sees at least one device; False
        otherwise; None from a plugin that does not handle `chip`. Must be cheap, must not create a
        device context (no ``set_device``, no ``current_device()``: on NPUs and GPUs that opens a
        context on device 0 in every rank) and must not poison ``fork()`` (CUDA: count devices
        through NVML, not ``cudaGetDeviceCount``).
    :raises: should not raise; the HAL treats an exception as "not available".

    Example::

        class AcmeChip(sdk.Chip):          # hal.sdk.Chip.native_available: the probe's verdict
            def probe(self, bind=False):
                found = importlib.util.find_spec("torch_acme") is not None and torch.acme.device_count() > 0
                return {"native": found, "reason": "torch_acme sees a device" if found else "no torch_acme"}
    """


@hookspec(firstresult=True)
def hal_chip_profile(chip: str, model: Optional[str]) -> "Optional[ChipProfile]":
    """Give the `ChipProfile` of `chip`. **Required per chip.**

    :required: per chip
    :when: registration, native bind
    :called: at registration the owner alone (its answer is validated); at bind the owner of `chip`
        and every plugin that declares no chip (add-ons); never the owners of other chips.
    :combined: the first non-None answer wins (an add-on's ``tryfirst`` answer before the owner's;
        wrappers wrap it).

    :param chip: a chip name the owner declared.
    :param model: the product name the device reports (``runtime.device_name()``, read after the
        device was selected) when bound natively, a model named in a cluster spec, or None for the
        plugin's default profile (at validation and for emulated chips with no model given).
    :returns: a `ChipProfile` (or a dict that validates as one); unknown figures are
        ``hal.unknown(...)``, never invented; None from a plugin that does not handle `chip`.
    :raises: a profile that does not validate refuses the plugin (`ProfileValidationError`).
    """


@hookspec(firstresult=True)
def hal_device_runtime(chip: str) -> "Optional[DeviceRuntime]":
    """Give the native device runtime of `chip`. **Required per chip.**

    :required: per chip
    :when: native bind, before the device is selected
    :called: the owner of `chip` and every plugin that declares no chip (add-ons); never the owners
        of other chips.
    :combined: the first non-None answer wins (an add-on's ``tryfirst`` answer before the owner's;
        wrappers wrap it).

    Called once, when this process binds `chip` natively (never for an emulated chip: the HAL runs
    those on `hal.emulation.runtime.EmulatedRuntime`). The HAL then selects the device
    (``set_device_index(LOCAL_RANK % device_count())``) before it asks anything else of the runtime
    (device name, capabilities), so the runtime must not touch a device in its constructor.

    :param chip: a chip name the owner declared.
    :returns: a `hal.DeviceRuntime`; for an adapter that mirrors torch.cuda's module functions,
        ``hal.TorchDeviceRuntime(torch.acme, "acme")``; None from a plugin that does not handle `chip`.
    :raises: `hal.ChipUnavailableError` when the adapter or the devices are missing.
    """


@hookspec(firstresult=True)
def hal_create_process_group(chip: str, store: "dist.Store", rank: int, world_size: int,
                             timeout: timedelta, global_ranks: Sequence[int],
                             group_name: str) -> "Optional[dist.ProcessGroup]":
    """Create the vendor CCL process group of `chip` for `world_size` ranks. **Required per chip.**

    :required: per chip
    :when: each native group creation
    :called: the owner of `chip` and every plugin that declares no chip (add-ons); never the owners
        of other chips.
    :combined: the first non-None answer wins (an add-on's ``tryfirst`` answer before the owner's;
        wrappers wrap it).

    Called inside a torch.distributed backend creator (the default group may not exist yet), so
    build the group object directly from `store`, never through ``dist.new_group``; build it the
    way torch's ``distributed_c10d._new_process_group_helper`` builds its own backends (options
    with ``_timeout``, ``global_ranks_in_group`` and the group name). Only called for natively
    bound chips; emulated chips get the HAL's CPU fabric.

    :param chip: a chip name the owner declared.
    :param store: the group's own store (already prefixed for this group).
    :param rank: this process's rank in the group, ``0 <= rank < world_size``.
    :param world_size: the number of ranks in the group.
    :param timeout: every collective of the group must end within it, with an error the caller can
        catch (``RuntimeError`` or a subclass), never a hang and never a process teardown; derive
        the CCL's own timeouts from it and say in your docs what a timeout does.
    :param global_ranks: the group's members as global ranks of the job (torch's
        ``global_ranks_in_group``), in group-rank order; ``len(global_ranks) == world_size``.
        (Contract 1.1; a 1.0 implementation may omit it.)
    :param group_name: a name that is the same on every member and differs between groups of one
        job (torch's group name / ``_DistributedBackendOptions.group_id``). CCLs that derive a
        communicator id from it (HCCL hashes ``group_id``) need exactly that; never substitute a
        per-process counter, which differs between processes whose memberships differ. (1.1)
    :returns: a ``torch.distributed.ProcessGroup`` or backend object; None from a plugin that does
        not handle `chip`.
    :raises: ``ValueError`` naming the argument for a bad rank, size, timeout, ranks or name;
        `hal.ChipUnavailableError` when the vendor backend is missing.

    Example::

        @sdk.hookimpl
        def hal_create_process_group(chip, store, rank, world_size, timeout, global_ranks, group_name):
            opts = ProcessGroupACCL.Options()
            opts._timeout, opts.global_ranks_in_group, opts.group_name = timeout, list(global_ranks), group_name
            return ProcessGroupACCL(store, rank, world_size, opts)
    """


@hookspec(firstresult=True)
def hal_collective_capabilities(chip: str) -> "Optional[CapabilityMatrix]":
    """Say which collective x dtype x reduce op the vendor CCL of `chip` does natively.
    **Required per chip.**

    :required: per chip
    :when: registration, native bind
    :called: at registration the owner alone (its answer is validated); at bind the owner of `chip`
        and every plugin that declares no chip (add-ons); never the owners of other chips.
    :combined: the first non-None answer wins (an add-on's ``tryfirst`` answer before the owner's;
        wrappers wrap it).

    Asked at load (no device selected yet: give the matrix of the default product) and again at
    native bind, after the device was selected (the matrix may then depend on the product, e.g.
    the SoC version). The bridge emulates whatever is missing (never silently wrong), and the
    conformance suite checks both directions: a declared combination must be correct, an
    undeclared one must raise `hal.NotSupportedError` or be emulated.

    :param chip: a chip name the owner declared.
    :returns: a `hal.CapabilityMatrix` whose ``source`` says how you know; None from a plugin that
        does not handle `chip`.
    :raises: nothing on purpose; any exception refuses the plugin at load.
    """


@hookspec
def hal_op_kernels(chip: str, emulated: bool) -> "Optional[list[OpKernel]]":
    """Offer kernels that override HAL ops on `chip`. Optional; any plugin may answer for any chip.

    :required: optional
    :when: registration, bind
    :called: every plugin that implements it, for every chip (owners of other chips included), each
        on its own with the wrappers kept (at registration each new plugin alone, for every known chip).
    :combined: every plugin's list is collected and merged; per op the highest priority wins (the HAL
        reference, priority 0, is last), so any plugin can replace any chip's kernels.

    :param chip: the chip being bound in this process (also every known chip, emulated, at load).
    :param emulated: True when `chip` runs emulated on CPU tensors: only return kernels that run on
        CPU tensors then (the vendor's fused kernels need the real device).
    :returns: a list of `hal.OpKernel` (op name, callable with the op's signature, priority), or
        None; all plugins' lists are merged. For each op the highest priority wins; the HAL's
        reference kernel has priority 0 and is always last.
    :raises: nothing on purpose; an unknown op name, a non-callable kernel or an exception refuses
        the plugin at load.

    Example::

        @sdk.hookimpl
        def hal_op_kernels(chip, emulated):
            if chip == "ascend" and not emulated:
                return [sdk.OpKernel("rms_norm", _npu_rms_norm, priority=10)]
    """
