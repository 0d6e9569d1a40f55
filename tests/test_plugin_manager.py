"""The plugin manager refuses every broken plugin at load, naming the plugin and the hook; and its
discovery switches (HAL_DISABLE_PLUGIN_AUTOLOAD, HAL_PLUGINS) do what they say.

Plugins here are small namespaces of hook functions registered into fresh `hal.PluginManager()`s;
the process-wide manager is never touched.
"""
from __future__ import annotations

import textwrap
import types
from importlib import metadata

import pytest

import hal
from hal.core import plugin_manager as pm_module
from hal.contract.version import CONTRACT_VERSION, compatible, parse_version
from hal.contract.errors import (ContractVersionError, DuplicateChipError, PluginHookError, PluginValidationError,
                        ProfileValidationError)

_DROP = object()


def _profile(chip: str, **changes) -> dict:
    prof = dict(chip=chip, model="Acme A1",
                peak_flops={"bfloat16": {"value": 1e12, "unit": "FLOP/s", "source": "Acme datasheet p. 1"}},
                memory_bytes={"value": 16e9, "unit": "B", "source": "Acme datasheet p. 1"},
                memory_bandwidth=hal.unknown("B/s"), intra_node_bandwidth=hal.unknown("B/s"),
                nic_bandwidth=hal.unknown("B/s"))
    prof.update(changes)
    return prof


def make_plugin(name: str = "acme", chip: str = "acme", version: str = CONTRACT_VERSION, **hooks):
    """A valid plugin providing `chip`; `hook=fn` replaces a hook, `hook=_DROP` removes it."""
    def hal_plugin_info():
        return hal.PluginInfo(name=name, version="0.1.0", contract_version=version)

    def hal_chips():
        return [hal.ChipSpec(name=chip, vendor="Acme", torch_device_type="cpu", ccl_backend="gloo")]

    def hal_native_available(chip):
        return False

    def hal_chip_profile(chip, model):
        return hal.ChipProfile(**_profile(chip))

    def hal_device_runtime(chip):
        return hal.CpuRuntime()

    def hal_create_process_group(chip, store, rank, world_size, timeout):
        return None

    def hal_collective_capabilities(chip):
        return hal.CapabilityMatrix.build(chip, "test plugin", collectives=["all_reduce"], dtypes=["float32"],
                                          reduce_ops=["sum"])

    impls = dict(hal_plugin_info=hal_plugin_info, hal_chips=hal_chips, hal_native_available=hal_native_available,
                 hal_chip_profile=hal_chip_profile, hal_device_runtime=hal_device_runtime,
                 hal_create_process_group=hal_create_process_group,
                 hal_collective_capabilities=hal_collective_capabilities)
    for hook, fn in hooks.items():
        if fn is _DROP:
            impls.pop(hook, None)
        else:
            impls[hook] = fn
    plugin = types.ModuleType(f"test_plugin_{name}")   # modules are hashable, as pluggy needs
    for k, v in impls.items():
        setattr(plugin, k, hal.hookimpl(v))
    return plugin


def refuse(plugin, error=PluginValidationError, *, pm=None, name="acme", hook=None, match=None):
    """Register `plugin` into a fresh manager (or `pm`), expect `error` naming plugin and hook."""
    pm = pm or hal.PluginManager()
    before = list(pm.plugins)
    with pytest.raises(error) as info:
        pm.register(plugin, name=name)
    err = info.value
    assert err.plugin == name and f"plugin {name!r}" in str(err)
    if hook is not None:
        assert err.hook == hook and f"hook {hook!r}" in str(err)
    if match is not None:
        assert match in str(err), str(err)
    # Refused cleanly: not half-registered, so a fixed plugin can be registered afterwards.
    assert list(pm.plugins) == before and plugin not in pm.pm.get_plugins()
    return err


def test_valid_plugin_registers():
    pm = hal.PluginManager()
    rec = pm.register(make_plugin(), name="acme")
    assert rec.chips == ["acme"] and rec.info.contract_version == CONTRACT_VERSION
    assert pm.chip("acme").vendor == "Acme" and pm.profile("acme").peak("bfloat16") == 1e12
    assert pm.capabilities("acme").supports("all_reduce", "float32", "sum")


# ---- pluggy's own validation, hook names, required hooks ------------------------------------
def test_hookimpl_argument_not_in_spec():
    def hal_chips(bogus):
        return []
    refuse(make_plugin(hal_chips=hal_chips), hook="hal_chips", match="bogus")


def test_unknown_hook_name():
    def hal_chipz():
        return []
    refuse(make_plugin(hal_chipz=hal_chipz), hook="hal_chipz", match="unknown hook 'hal_chipz'")


@pytest.mark.parametrize("hook", ["hal_plugin_info", "hal_chips"])
def test_missing_required_hook(hook):
    refuse(make_plugin(**{hook: _DROP}), hook=hook, match=f"required hook {hook!r} is not implemented")


@pytest.mark.parametrize("hook", ["hal_native_available", "hal_chip_profile", "hal_device_runtime",
                                  "hal_create_process_group", "hal_collective_capabilities"])
def test_missing_per_chip_hook(hook):
    refuse(make_plugin(**{hook: _DROP}), hook=hook, match="declares chips ['acme']")


def test_kernel_only_plugin_needs_no_chip_hooks():
    def hal_chips():
        return []
    per_chip = {h: _DROP for h in pm_module.REQUIRED_PER_CHIP}
    pm = hal.PluginManager()
    assert pm.register(make_plugin(name="fastops", hal_chips=hal_chips, **per_chip), name="fastops").chips == []


# ---- contract version ---------------------------------------------------------------------
def test_wrong_major_contract_version():
    major, _ = parse_version(CONTRACT_VERSION)
    err = refuse(make_plugin(version=f"{major + 1}.0"), ContractVersionError, hook="hal_plugin_info")
    assert f"{major + 1}.0" in str(err) and CONTRACT_VERSION in str(err)


def test_newer_minor_contract_version():
    major, minor = parse_version(CONTRACT_VERSION)
    err = refuse(make_plugin(version=f"{major}.{minor + 1}"), ContractVersionError, hook="hal_plugin_info")
    assert f"{major}.{minor + 1}" in str(err)


def test_older_minor_is_compatible():
    assert compatible("1.0", "1.3") and not compatible("1.4", "1.3") and not compatible("2.0", "1.9")


def test_malformed_contract_version():
    refuse(make_plugin(version="one"), hook="hal_plugin_info", match="ValidationError")


# ---- duplicates ---------------------------------------------------------------------------
def test_two_plugins_claiming_one_chip():
    pm = hal.PluginManager()
    pm.register(make_plugin(name="acme"), name="acme")
    err = refuse(make_plugin(name="acme2"), DuplicateChipError, pm=pm, name="acme2", hook="hal_chips")
    assert "chip 'acme' is already provided by plugin 'acme'" in str(err)
    assert pm.plugin_of("acme").name == "acme"


def test_two_plugins_with_one_name():
    pm = hal.PluginManager()
    pm.register(make_plugin(name="acme", chip="a1"), name="acme-a")
    refuse(make_plugin(name="acme", chip="a2"), pm=pm, name="acme-b", hook="hal_plugin_info",
           match="a plugin named 'acme' is already registered")


# ---- profiles -----------------------------------------------------------------------------
def test_profile_figure_without_source():
    def hal_chip_profile(chip, model):
        return _profile(chip, memory_bytes={"value": 16e9, "unit": "B"})
    refuse(make_plugin(hal_chip_profile=hal_chip_profile), ProfileValidationError, hook="hal_chip_profile",
           match="has no source")


def test_profile_built_in_the_hook_with_a_wrong_unit():
    def hal_chip_profile(chip, model):
        return hal.ChipProfile(**_profile(chip, memory_bandwidth=hal.unknown("B")))
    refuse(make_plugin(hal_chip_profile=hal_chip_profile), ProfileValidationError, hook="hal_chip_profile",
           match="memory_bandwidth has unit 'B', expected 'B/s'")


def test_profile_peak_flops_wrong_unit():
    def hal_chip_profile(chip, model):
        return _profile(chip, peak_flops={"bfloat16": {"value": 1e12, "unit": "B/s", "source": "x"}})
    refuse(make_plugin(hal_chip_profile=hal_chip_profile), ProfileValidationError, hook="hal_chip_profile",
           match="expected 'FLOP/s'")


def test_profile_for_another_chip():
    def hal_chip_profile(chip, model):
        return hal.ChipProfile(**_profile("cuda"))
    refuse(make_plugin(hal_chip_profile=hal_chip_profile), ProfileValidationError, hook="hal_chip_profile",
           match="profile is for chip 'cuda'")


# ---- return types and hooks that raise -----------------------------------------------------
@pytest.mark.parametrize("hook,value,expect", [
    ("hal_plugin_info", "acme 0.1", "expected hal.PluginInfo"),
    ("hal_chips", {"acme": "chip"}, "expected a list of hal.ChipSpec"),
    ("hal_chips", ["acme"], "expected a list of hal.ChipSpec"),
    ("hal_chip_profile", 42, "expected hal.ChipProfile"),
    ("hal_collective_capabilities", [("all_reduce", "float32", "sum")], "expected hal.CapabilityMatrix"),
    ("hal_op_kernels", ["rms_norm"], "expected hal.OpKernel"),
    ("hal_op_kernels", "rms_norm", "expected a list of hal.OpKernel"),
])
def test_bad_return_types(hook, value, expect):
    spec_args = {"hal_plugin_info": "", "hal_chips": "", "hal_chip_profile": "chip, model",
                 "hal_collective_capabilities": "chip", "hal_op_kernels": "chip, emulated"}[hook]
    fn = eval(f"lambda {spec_args}: value", {"value": value})  # a hook with the spec's argument names
    fn.__name__ = hook
    refuse(make_plugin(**{hook: fn}), hook=hook, match=expect)


def test_hook_that_raises_at_load():
    def hal_collective_capabilities(chip):
        raise RuntimeError("libaccl.so not found")
    refuse(make_plugin(hal_collective_capabilities=hal_collective_capabilities),
           hook="hal_collective_capabilities", match="raised RuntimeError: libaccl.so not found")


def test_hook_that_raises_at_bind_time():
    def hal_device_runtime(chip):
        raise OSError("no device")
    pm = hal.PluginManager()
    pm.register(make_plugin(hal_device_runtime=hal_device_runtime), name="acme")
    with pytest.raises(PluginHookError, match=r"plugin 'acme', hook 'hal_device_runtime': chip 'acme': OSError"):
        pm.call_owner("acme", "hal_device_runtime")


# ---- op kernels ---------------------------------------------------------------------------
def test_unknown_op_name_in_kernels():
    def hal_op_kernels(chip, emulated):
        return [hal.OpKernel("flash_attn", lambda q, k, v: q, priority=5)]
    err = refuse(make_plugin(hal_op_kernels=hal_op_kernels), hook="hal_op_kernels",
                 match="unknown op 'flash_attn'")
    assert "rms_norm" in str(err)      # lists the HAL ops


def test_kernel_plugin_checked_against_chips_already_known():
    """A third-party kernel package (no chips of its own) is validated, at load, for every chip
    registered before it, and its kernels are offered for that chip."""
    def no_chips():
        return []

    def good_kernels(chip, emulated):
        return [hal.OpKernel("rms_norm", lambda x, weight, eps=1e-6: x, priority=5)]

    def bad_kernels(chip, emulated):
        return [hal.OpKernel("not_an_op", lambda x: x)] if chip == "acme" else []

    per_chip = {h: _DROP for h in pm_module.REQUIRED_PER_CHIP}
    pm = hal.PluginManager()
    pm.register(make_plugin(), name="acme")
    pm.register(make_plugin(name="fastops", hal_chips=no_chips, hal_op_kernels=good_kernels, **per_chip),
                name="fastops")
    assert [(k.op, k.plugin, k.priority) for k in pm.op_kernels("acme", emulated=True)] == [("rms_norm", "fastops", 5)]
    refuse(make_plugin(name="badops", hal_chips=no_chips, hal_op_kernels=bad_kernels, **per_chip), pm=pm,
           name="badops", hook="hal_op_kernels", match="chip 'acme': unknown op 'not_an_op'")


# ---- discovery switches -------------------------------------------------------------------
def _dist_of_cpu() -> str:
    ep = next(e for e in metadata.entry_points(group=pm_module.ENTRY_POINT_GROUP) if e.name == "cpu")
    return f"{ep.dist.name} {ep.dist.version}"


def test_autoload_finds_the_cpu_plugin_with_its_distribution():
    pm = hal.PluginManager()
    pm.load_entry_points(env={})
    assert "cpu" in pm.plugins and pm.plugins["cpu"].distribution == _dist_of_cpu()


def test_disable_autoload():
    pm = hal.PluginManager()
    pm.load_entry_points(env={"HAL_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert pm.plugins == {} and pm.chips == {}
    pm.load_entry_points(env={"HAL_DISABLE_PLUGIN_AUTOLOAD": "0"})   # "0" means not disabled
    assert "cpu" in pm.plugins


ACME_MODULE = textwrap.dedent('''
    """A plugin importable by module path (for HAL_PLUGINS)."""
    import hal

    @hal.hookimpl
    def hal_plugin_info():
        return hal.PluginInfo(name="acme", version="0.2.0", contract_version=hal.CONTRACT_VERSION)

    @hal.hookimpl
    def hal_chips():
        return []
''')


def test_hal_plugins_by_entry_point_name_and_module_path(tmp_path, monkeypatch):
    (tmp_path / "acme_hal_testplugin.py").write_text(ACME_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    pm = hal.PluginManager()
    # explicit plugins load even with autoload disabled (as pytest's -p with PYTEST_DISABLE_PLUGIN_AUTOLOAD)
    pm.load_entry_points(env={"HAL_PLUGINS": "cpu, acme_hal_testplugin", "HAL_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert list(pm.plugins) == ["cpu", "acme"]
    assert pm.plugins["cpu"].distribution == _dist_of_cpu()
    assert pm.plugins["acme"].distribution is None and pm.plugins["acme"].info.version == "0.2.0"


def test_hal_plugins_only_loads_what_it_names(tmp_path, monkeypatch):
    (tmp_path / "acme_hal_testplugin.py").write_text(ACME_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    pm = hal.PluginManager()
    pm.load_entry_points(env={"HAL_PLUGINS": "acme_hal_testplugin"})
    assert list(pm.plugins) == ["acme"]


def test_hal_plugins_unknown_name():
    with pytest.raises(PluginValidationError, match=r"plugin 'no_such_hal_plugin'.*neither an entry point "
                                                    r"of group 'hal.plugins' \(.*'cpu'.*\) nor importable"):
        hal.PluginManager().load_entry_points(env={"HAL_PLUGINS": "no_such_hal_plugin"})


def test_entry_point_that_fails_to_import(monkeypatch):
    broken = metadata.EntryPoint(name="broken", value="no_such_module_for_hal_tests", group="hal.plugins")
    monkeypatch.setattr(pm_module.metadata, "entry_points", lambda group: [broken])
    with pytest.raises(PluginValidationError, match=r"plugin 'broken': entry point 'no_such_module_for_hal_tests' "
                                                    r"failed to import: ModuleNotFoundError"):
        hal.PluginManager().load_entry_points(env={})


# ---- pluggy dispatches every hook (contract 1.1) ---------------------------------------------------
class ProcessGroupLogger:
    """A third-party add-on (no chips of its own) that wraps every plugin's process-group creation."""

    __name__ = "pglogger"

    def __init__(self):
        self.log = []

    @hal.hookimpl
    def hal_plugin_info(self):
        return hal.PluginInfo(name="pglogger", version="0.1", contract_version=CONTRACT_VERSION)

    @hal.hookimpl
    def hal_chips(self):
        return []

    @hal.hookimpl(wrapper=True)
    def hal_create_process_group(self, chip, rank, world_size, global_ranks, group_name):
        group = yield  # the owner's group (or an exception, which propagates)
        self.log.append((chip, rank, world_size, list(global_ranks), group_name, group))
        return group


@pytest.fixture
def restore_binding():
    prev = hal.bound()
    yield
    hal.reset()
    if prev is not None:
        import importlib
        importlib.import_module("hal.core.selection")._BOUND = prev
        hal.ops.bind(prev.kernels)


def _native_chip(name, group):
    """A chip plugin that is natively available (runs on the host) and builds `group`."""
    def hal_create_process_group(chip, store, rank, world_size, timeout, global_ranks, group_name):
        return (group, chip, tuple(global_ranks), group_name)
    return make_plugin(name=name, chip=name, hal_native_available=lambda chip: True,
                       hal_create_process_group=hal_create_process_group)


def test_a_wrapper_plugin_logs_every_process_group_creation(restore_binding):
    """pluggy calls the add-on's wrapper around the owner's implementation, with the group's global
    ranks and name (failed before: hooks were called directly on the owner, so no wrapper ran)."""
    pm = hal.PluginManager()
    pm.register(_native_chip("acme", "acme-group"), name="acme")
    logger = ProcessGroupLogger()
    pm.register(logger, name="pglogger")
    acc = hal.bind("acme", emulated=False, pm=pm)
    import torch.distributed as dist
    from datetime import timedelta
    got = acc.new_process_group(dist.HashStore(), 1, 2, timedelta(seconds=5), global_ranks=[4, 6],
                                group_name="hetero/intra/0")
    assert got == ("acme-group", "acme", (4, 6), "hetero/intra/0")
    assert logger.log == [("acme", 1, 2, [4, 6], "hetero/intra/0", got)]


def test_owners_of_other_chips_never_answer_and_a_1_0_signature_still_loads():
    """A contract 1.0 owner that ignores `chip` (registered last, so first in pluggy's LIFO order)
    does not answer for another plugin's chip: owners of other chips are left out of the call."""
    from datetime import timedelta

    def legacy_group(chip, store, rank, world_size, timeout):  # contract 1.0: no global_ranks/group_name
        return "legacy-group"
    pm = hal.PluginManager()
    pm.register(_native_chip("acme", "acme-group"), name="acme")
    pm.register(make_plugin(name="legacy", chip="legacy", version="1.0", hal_create_process_group=legacy_group,
                            hal_native_available=lambda chip: "legacy says yes"), name="legacy")
    args = dict(store=None, rank=0, world_size=1, timeout=timedelta(seconds=1), global_ranks=[0], group_name="g")
    assert pm.call_owner("acme", "hal_create_process_group", **args)[0] == "acme-group"
    assert pm.call_owner("legacy", "hal_create_process_group", **args) == "legacy-group"
    assert pm.native_available("acme") is True and pm.call_owner("legacy", "hal_native_available") == "legacy says yes"


def test_tryfirst_add_on_overrides_for_the_chips_it_handles():
    from datetime import timedelta

    class Override:
        __name__ = "override"

        @hal.hookimpl
        def hal_plugin_info(self):
            return hal.PluginInfo(name="override", version="0.1", contract_version=CONTRACT_VERSION)

        @hal.hookimpl
        def hal_chips(self):
            return []

        @hal.hookimpl(tryfirst=True)
        def hal_create_process_group(self, chip):
            return "override-group" if chip == "acme" else None  # None: not handled, next plugin

        @hal.hookimpl(trylast=True)
        def hal_collective_capabilities(self, chip):
            return hal.CapabilityMatrix(chip=chip, source="fallback that should never win")

    pm = hal.PluginManager()
    pm.register(_native_chip("acme", "acme-group"), name="acme")
    pm.register(_native_chip("beta", "beta-group"), name="beta")
    pm.register(Override(), name="override")
    args = dict(store=None, rank=0, world_size=1, timeout=timedelta(seconds=1), global_ranks=[0], group_name="g")
    assert pm.call_owner("acme", "hal_create_process_group", **args) == "override-group"
    assert pm.call_owner("beta", "hal_create_process_group", **args)[0] == "beta-group"
    assert pm.capabilities("acme").source == "test plugin"  # firstresult: the owner's, not the trylast


def test_every_bind_time_hook_goes_through_pluggy(restore_binding):
    """pluggy's hook-call monitoring sees each chip-scoped hook the HAL asks at bind time."""
    pm = hal.PluginManager()
    pm.register(_native_chip("acme", "acme-group"), name="acme")
    seen = []
    undo = pm.pm.add_hookcall_monitoring(lambda name, impls, kwargs: seen.append(name), lambda *a: None)
    try:
        hal.bind("acme", emulated=False, pm=pm)
    finally:
        undo()
    assert {"hal_native_available", "hal_device_runtime", "hal_chip_profile",
            "hal_collective_capabilities"} <= set(seen), seen
