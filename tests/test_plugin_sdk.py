"""The plugin SDK and the chip base class: `hal.sdk` resolves every name it documents without importing
torch; a `hal.sdk.Chip` subclass becomes pluggy hooks (`hal.sdk.plugin`) that the manager dispatches
like hand-written ones (routing to the owner only, wrappers and tryfirst add-ons still apply); the
base refuses a class that is incomplete or overrides a hook; the in-tree plugins are such classes.
Fresh `hal.PluginManager()`s only; the process-wide manager is never touched.
"""
from __future__ import annotations

import json
import subprocess
import sys
import types
from datetime import timedelta

import pytest

import hal
from hal import sdk
from hal.contract.errors import PluginValidationError

from .test_plugin_manager import ProcessGroupLogger, restore_binding  # noqa: F401  (fixture)

ARGS = dict(store=None, rank=1, world_size=2, timeout=timedelta(seconds=5), global_ranks=[3, 5], group_name="g")


def _chip_class(chip: str = "acme", native: bool = True):
    """A complete Chip on host tensors that records every method call in `calls`."""
    class AcmeChip(sdk.Chip):
        spec = sdk.ChipSpec(name=chip, vendor="Acme", torch_device_type="cpu", ccl_backend="gloo")
        version = "2.0.0"
        description = "test chip"

        def __init__(self):
            self.calls = []

        def probe(self, bind=False):
            self.calls.append(("probe", bind))
            return {"native": native, "reason": "the test says so"}

        def profile(self, model):
            self.calls.append(("profile", model))
            why = "test"
            return sdk.ChipProfile(chip=chip, model=model or "A1", peak_flops={},
                                   memory_bytes=sdk.unknown("B", why), memory_bandwidth=sdk.unknown("B/s", why),
                                   intra_node_bandwidth=sdk.unknown("B/s", why), nic_bandwidth=sdk.unknown("B/s", why))

        def device_runtime(self):
            self.calls.append(("device_runtime",))
            return sdk.CpuRuntime()

        def create_process_group(self, store, rank, world_size, timeout, global_ranks, group_name):
            self.calls.append(("create_process_group", rank, world_size, list(global_ranks), group_name))
            return f"{chip}-group"

        def collective_capabilities(self):
            self.calls.append(("collective_capabilities",))
            return sdk.CapabilityMatrix.build(chip, "test", collectives=["all_reduce"], dtypes=["float32"],
                                              reduce_ops=["sum"])

        def op_kernels(self, emulated):
            self.calls.append(("op_kernels", emulated))
            return [sdk.OpKernel("silu", lambda x: x, priority=5, name=f"{chip}.silu")]

        def op_kernels_for(self, other, emulated):
            self.calls.append(("op_kernels_for", other, emulated))
            return None
    return AcmeChip


def test_import_hal_sdk_is_cheap_and_every_documented_name_resolves():
    code = ("import json, sys, hal.sdk as s; before = 'torch' in sys.modules; "
            "missing = [n for n in s.__all__ if getattr(s, n, None) is None]; "
            "print(json.dumps([before, missing, sorted(n for n in s.__all__ if n not in s.__doc__)]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    torch_at_import, missing, undocumented = json.loads(out.stdout)
    assert torch_at_import is False and missing == [] and undocumented == []
    with pytest.raises(AttributeError, match="a plugin uses only the names hal.sdk exports"):
        sdk.PluginRecord  # noqa: B018


def test_a_chip_class_answers_every_hook_through_the_manager(restore_binding):
    pm = hal.PluginManager()
    rec = pm.register(_chip_class())  # a Chip class: registered as sdk.plugin(class)
    chip = rec.module.chip
    assert rec.describe()["chips"] == ["acme"] and (rec.info.name, rec.info.version) == ("acme", "2.0.0")
    assert pm.native_available("acme") is True and pm.profile("acme", "A9").model == "A9"
    acc = hal.bind("acme", emulated=False, pm=pm)
    assert acc.kernels["silu"].name == "acme.silu" and acc.kernels["silu"].plugin == "acme"
    assert acc.new_process_group(**ARGS) == "acme-group"
    assert ("probe", True) in chip.calls and ("device_runtime",) in chip.calls
    assert ("create_process_group", 1, 2, [3, 5], "g") in chip.calls


def test_a_module_with_the_generated_hooks_is_a_plain_pluggy_plugin():
    """What the in-tree plugins do: the entry point names a module holding PLUGIN.hookimpls()."""
    plugin = sdk.plugin(_chip_class())
    module = types.ModuleType("hal_acme")
    for name, fn in plugin.hookimpls().items():
        setattr(module, name, fn)
    assert sorted(plugin.hookimpls()) == sorted(n for n in dir(hal.contract.hookspecs) if n.startswith("hal_"))
    pm = hal.PluginManager()
    pm.register(module)
    assert pm.capabilities("acme").source == "test" and module.hal_native_available("acme") is True


def test_routing_happens_in_the_manager_and_add_ons_still_wrap(restore_binding):
    """Two chip classes never answer for each other's chip (no chip check in their hooks); an add-on's
    wrapper wraps a class's process-group creation; op kernels ask the class about other chips once."""
    pm = hal.PluginManager()
    acme, beta = (pm.register(_chip_class(name)).module.chip for name in ("acme", "beta"))
    logger = ProcessGroupLogger()
    pm.register(logger, name="pglogger")
    assert pm.call_owner("beta", "hal_create_process_group", **ARGS) == "beta-group"
    assert [c for c in acme.calls if c[0] == "create_process_group"] == []
    assert logger.log == [("beta", 1, 2, [3, 5], "g", "beta-group")]
    acme.calls.clear()
    pm.op_kernels("beta", emulated=True)
    assert [c for c in acme.calls if c[0].startswith("op_kernels")] == [("op_kernels_for", "beta", True)]


def test_not_native_refuses_the_runtime_naming_plugin_hook_and_reason():
    pm = hal.PluginManager()
    pm.register(_chip_class(native=False))
    with pytest.raises(hal.ChipUnavailableError, match="plugin 'acme', hook 'hal_device_runtime': chip 'acme' "
                                                       "is not natively available: the test says so"):
        pm.call_owner("acme", "hal_device_runtime")


def test_the_base_refuses_incomplete_classes_and_overridden_hooks():
    class NoSpec(_chip_class()):
        spec = None
    with pytest.raises(PluginValidationError, match="spec must be a hal.sdk.ChipSpec"):
        hal.PluginManager().register(NoSpec)

    class Partial(sdk.Chip):
        spec = sdk.ChipSpec(name="part", vendor="X", torch_device_type="cpu", ccl_backend="gloo")

        def probe(self, bind=False):
            return {"native": False, "reason": "-"}
    with pytest.raises(TypeError, match=r"does not define \['profile', 'device_runtime', 'create_process_group', "
                                        r"'collective_capabilities'\]"):
        sdk.plugin(Partial)
    with pytest.raises(TypeError, match=r"defines \['hal_native_available'\].*generated by hal.sdk.plugin"):
        class Hooked(sdk.Chip):  # noqa: F841
            def hal_native_available(self, chip):
                return True


def test_in_tree_plugins_are_chip_classes_kunlun_reusing_cuda():
    import hal_ascend
    import hal_cpu
    import hal_cuda
    import hal_kunlun
    for module, cls in ((hal_cpu, hal_cpu.CpuChip), (hal_cuda, hal_cuda.CudaChip),
                        (hal_ascend, hal_ascend.AscendChip), (hal_kunlun, hal_kunlun.KunlunChip)):
        assert type(module.PLUGIN.chip) is cls and module.CHIP is cls.spec
        assert module.hal_chips() == [cls.spec]
    assert issubclass(hal_kunlun.KunlunChip, hal_cuda.CudaChip)
    assert hal_cuda.hal_native_available("cuda") is hal_cuda.PLUGIN.chip.native_available()
