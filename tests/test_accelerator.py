"""hal.accelerator(): chip selection order, its errors, binding once, and what describe() reports.

Vendor plugins are written elsewhere, so chips other than `cpu` come from `FakeChips`, a tiny
in-test plugin (a fresh PluginManager with hal_cpu and it; the global one is restored afterwards).
A "native" fake chip runs on a recording stand-in runtime.
"""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

import hal
from hal.core.selection import select_chip
from hal.contract.capabilities import CapabilityMatrix
from hal.emulation.runtime import CpuRuntime

_acc_module = importlib.import_module("hal.core.selection")  # `hal.accelerator` is the function
REPO = Path(__file__).resolve().parents[1]
ENV_VARS = ("HAL_CHIP", "HAL_EMULATE", "HAL_CLUSTER", "HAL_EMULATE_DILATION", "RANK", "WORLD_SIZE",
            "LOCAL_RANK")


class RecordingRuntime(CpuRuntime):
    """Stand-in for a vendor runtime: a host runtime that says it has `count` devices and records
    set_device_index / manual_seed calls."""

    def __init__(self, count: int = 4):
        super().__init__()
        self.count, self.index, self.calls = count, 0, []

    def device_count(self) -> int:
        return self.count

    def current_device_index(self) -> int:
        return self.index

    def set_device_index(self, index: int) -> None:
        self.calls.append(("set_device_index", index))
        self.index = index

    def manual_seed(self, seed: int) -> None:
        self.calls.append(("manual_seed", seed))
        super().manual_seed(seed)


class FakeChips:
    """A plugin providing test chips. `frozen = True` makes every hook raise (to prove that nothing
    calls a plugin after binding)."""

    def __init__(self, name="fakechips", chips=("cuda", "ascend"), native=(), peaks=None, runtime=None):
        self.__name__ = name
        self.chips, self.native, self.peaks = tuple(chips), set(native), dict(peaks or {})
        self.runtime = runtime
        self.frozen = False
        self.runtimes: list = []

    def _check(self, hook):
        if self.frozen:
            raise AssertionError(f"hook {hook} called after binding")

    @hal.hookimpl
    def hal_plugin_info(self):
        self._check("hal_plugin_info")
        return hal.PluginInfo(name=self.__name__, version="0.0", contract_version=hal.CONTRACT_VERSION)

    @hal.hookimpl
    def hal_chips(self):
        self._check("hal_chips")
        return [hal.ChipSpec(name=c, vendor="test", torch_device_type="cpu", ccl_backend="gloo") for c in self.chips]

    @hal.hookimpl
    def hal_native_available(self, chip):
        self._check("hal_native_available")
        return chip in self.native

    @hal.hookimpl
    def hal_chip_profile(self, chip, model):
        self._check("hal_chip_profile")
        peak = self.peaks.get(chip)
        fig = (hal.Figure(value=peak, unit="FLOP/s", source="test") if peak else hal.unknown("FLOP/s"))
        return hal.ChipProfile(chip=chip, model=model or f"{chip} test model", peak_flops={"bfloat16": fig},
                               memory_bytes=hal.unknown("B"), memory_bandwidth=hal.unknown("B/s"),
                               intra_node_bandwidth=hal.unknown("B/s"), nic_bandwidth=hal.unknown("B/s"))

    @hal.hookimpl
    def hal_device_runtime(self, chip):
        self._check("hal_device_runtime")
        rt = self.runtime if self.runtime is not None else RecordingRuntime()
        self.runtimes.append(rt)
        return rt

    @hal.hookimpl
    def hal_create_process_group(self, chip, store, rank, world_size, timeout):
        raise NotImplementedError("not needed here")

    @hal.hookimpl
    def hal_collective_capabilities(self, chip):
        self._check("hal_collective_capabilities")
        return CapabilityMatrix.build(chip, "test", collectives=("all_reduce",), dtypes=("float32",),
                                      reduce_ops=("sum",))


@pytest.fixture
def clean(monkeypatch):
    """No selection variables from the caller's environment; plugin manager and binding restored."""
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    pm, prev = _acc_module.get_plugin_manager(), hal.bound()
    hal.reset()
    yield monkeypatch
    hal.set_plugin_manager(pm)
    hal.reset()
    if prev is not None:
        _acc_module._BOUND = prev
        hal.ops.bind(prev.kernels)


def use(*plugins) -> hal.PluginManager:
    import hal_cpu
    pm = hal.PluginManager()
    pm.register(hal_cpu, distribution="test")
    for p in plugins:
        pm.register(p)
    hal.set_plugin_manager(pm)
    return pm


# ---- selection order -------------------------------------------------------------------------
def test_nothing_set_and_nothing_native_gives_cpu(clean):
    use(FakeChips())
    acc = hal.accelerator()
    assert (acc.chip.name, acc.emulated) == ("cpu", False)
    assert "no accelerator found" in acc.selection.reason


def test_the_one_native_chip_is_chosen(clean):
    fake = FakeChips(native=("ascend",))
    use(fake)
    acc = hal.accelerator()
    assert (acc.chip.name, acc.emulated) == ("ascend", False)
    assert acc.runtime is fake.runtimes[0] and "natively available" in acc.describe()["selected_by"]


def test_several_native_chips_must_be_chosen_between(clean):
    use(FakeChips(native=("cuda", "ascend")))
    with pytest.raises(hal.ChipSelectionError, match=r"several chips are natively available \(\['cuda', 'ascend'\]\)"):
        hal.accelerator()
    clean.setenv("HAL_CHIP", "ascend")
    assert hal.accelerator().chip.name == "ascend"


def test_explicit_argument_beats_hal_chip_and_hal_emulate(clean):
    use(FakeChips(native=("cuda",)))
    clean.setenv("HAL_CHIP", "cuda")
    clean.setenv("HAL_EMULATE", "ascend")
    acc = hal.accelerator("cpu")
    assert (acc.chip.name, acc.emulated) == ("cpu", False)


def test_hal_chip_beats_hal_emulate_and_cluster(clean):
    use(FakeChips(native=("cuda",)))
    clean.setenv("HAL_CHIP", "cuda")
    clean.setenv("HAL_EMULATE", "ascend")
    clean.setenv("HAL_CLUSTER", "/nonexistent/cluster.toml")  # never read
    acc = hal.accelerator()
    assert (acc.chip.name, acc.emulated) == ("cuda", False)


def test_hal_chip_named_in_hal_emulate_is_emulated(clean):
    use(FakeChips())
    clean.setenv("HAL_CHIP", "ascend")
    clean.setenv("HAL_EMULATE", "ascend")
    acc = hal.accelerator()
    assert (acc.chip.name, acc.emulated) == ("ascend", True)


@pytest.mark.parametrize("rank,chip", [(0, "cuda"), (1, "cuda"), (2, "ascend"), (3, "ascend")])
def test_hal_emulate_map_follows_global_rank(clean, rank, chip):
    use(FakeChips(native=("cuda",)))  # a native cuda does not override the emulation map
    clean.setenv("HAL_EMULATE", "cuda:2,ascend:2")
    clean.setenv("HAL_CLUSTER", "/nonexistent/cluster.toml")  # HAL_EMULATE comes first: never read
    clean.setenv("RANK", str(rank))
    clean.setenv("WORLD_SIZE", "4")
    acc = hal.accelerator()
    assert (acc.chip.name, acc.emulated) == (chip, True)
    assert acc.device == torch.device("cpu") and f"rank {rank}" in acc.selection.reason


def test_cluster_spec_is_used_after_hal_emulate(clean):
    use(FakeChips())
    clean.setenv("HAL_CLUSTER", str(REPO / "examples" / "clusters" / "laptop-2x2.toml"))
    clean.setenv("RANK", "3")
    clean.setenv("WORLD_SIZE", "4")
    acc = hal.accelerator()
    assert (acc.chip.name, acc.emulated) == ("ascend", True)
    assert acc.profile.model == "910B2" and "cluster spec" in acc.selection.reason
    hal.reset()
    clean.setenv("WORLD_SIZE", "8")
    with pytest.raises(hal.ChipSelectionError, match="world size 4 but WORLD_SIZE is 8"):
        hal.accelerator()


def test_dilation_under_a_cluster_spec_uses_its_sub_clusters(clean):
    # The peers of an emulated chip come from the cluster spec when HAL_EMULATE is unset, so the
    # slower chip is slowed by the faster one's / its own bf16 peak and the faster one not at all.
    pm = use(FakeChips(peaks={"cuda": 4e14, "ascend": 1e14}))
    clean.setenv("HAL_CLUSTER", str(REPO / "examples" / "clusters" / "laptop-2x2.toml"))
    clean.setenv("HAL_EMULATE_DILATION", "1")
    clean.setenv("WORLD_SIZE", "4")
    h100 = pm.profile("cuda", "H100").peak("bfloat16")
    b2 = pm.profile("ascend", "910B2").peak("bfloat16")
    assert (h100, b2) == (4e14, 1e14)
    clean.setenv("RANK", "2")
    assert hal.accelerator().runtime.dilation == pytest.approx(4.0)
    hal.reset()
    clean.setenv("RANK", "0")
    assert hal.accelerator().runtime.dilation == 1.0


def test_select_chip_takes_an_explicit_environment(clean):
    pm = use(FakeChips())
    env = {"HAL_EMULATE": "cuda:1,ascend:3", "RANK": "2", "WORLD_SIZE": "4"}
    assert select_chip(pm, env=env) == hal.accelerator.__globals__["Selection"](
        "ascend", True, "HAL_EMULATE='cuda:1,ascend:3', rank 2")
    assert select_chip(pm, env={}).chip == "cpu"


# ---- errors ----------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["argument", "HAL_CHIP", "HAL_EMULATE", "bind"])
def test_unknown_chip_lists_known_chips(clean, how):
    use(FakeChips())
    with pytest.raises(hal.UnknownChipError, match=r"chip 'tpu'; known chips: \['ascend', 'cpu', 'cuda'\]"):
        if how == "argument":
            hal.accelerator("tpu")
        elif how == "bind":
            hal.bind("tpu", emulated=True)
        else:
            clean.setenv(how, "tpu")
            hal.accelerator()
    assert hal.bound() is None


@pytest.mark.parametrize("value,env,message", [
    ("cuda:2,ascend", {}, "with several chips every item needs a count"),
    ("cuda:x", {}, r"item 'cuda:x' is not 'chip' or 'chip:count'"),
    (",", {}, "names no chip"),
    ("cuda:2,ascend:2", {"WORLD_SIZE": "3"}, "maps 4 ranks but WORLD_SIZE is 3"),
    ("cuda:2,ascend:2", {"RANK": "4"}, r"maps ranks 0..3; rank 4 is outside it"),
    ("cuda:2,ascend:2", {"RANK": "two"}, r"RANK='two' is not an integer"),
])
def test_bad_hal_emulate_is_a_selection_error(clean, value, env, message):
    use(FakeChips())
    clean.setenv("HAL_EMULATE", value)
    for k, v in env.items():
        clean.setenv(k, v)
    with pytest.raises(hal.ChipSelectionError, match=message):
        hal.accelerator()


def test_native_chip_that_is_absent_says_how_to_emulate(clean):
    use(FakeChips())
    clean.setenv("HAL_CHIP", "ascend")
    with pytest.raises(hal.ChipUnavailableError, match=r"chip 'ascend' \(plugin 'fakechips'\) is not natively "
                       r"available.*HAL_EMULATE=ascend"):
        hal.accelerator()


def test_runtime_hook_returning_garbage_names_plugin_and_hook(clean):
    use(FakeChips(native=("cuda",), runtime=object()))
    with pytest.raises(hal.ChipUnavailableError, match=r"plugin 'fakechips', hook 'hal_device_runtime'"):
        hal.accelerator()


def test_runtime_with_no_devices_is_refused(clean):
    use(FakeChips(native=("cuda",), runtime=RecordingRuntime(count=0)))
    with pytest.raises(hal.ChipUnavailableError, match="chip 'cuda': the runtime reports 0 devices"):
        hal.accelerator()


def test_rebinding_another_chip_is_refused(clean):
    use(FakeChips())
    acc = hal.accelerator("cpu")
    assert hal.accelerator() is acc and hal.accelerator("cpu") is acc
    with pytest.raises(hal.ChipSelectionError, match=r"bound to chip 'cpu'; cannot rebind to 'cuda'"):
        hal.accelerator("cuda")
    assert hal.bound() is acc
    hal.reset()  # tests (only) may start over
    assert hal.accelerator("cpu") is not acc


# ---- binding ---------------------------------------------------------------------------------
def test_native_device_index_comes_from_local_rank(clean):
    fake = FakeChips(native=("cuda",))
    use(fake)
    clean.setenv("LOCAL_RANK", "6")
    acc = hal.accelerator()
    assert fake.runtimes[0].calls == [("set_device_index", 2)]  # 6 % 4 devices
    assert acc.current_device_index() == 2


def test_no_plugin_call_after_binding(clean):
    fake = FakeChips(native=("cuda",))
    pm = use(fake)
    acc = hal.accelerator()

    def boom(*args, **kwargs):
        raise AssertionError("plugin lookup after binding")

    for name in ("_call_own", "call_owner", "op_kernels", "chip", "profile", "native_available",
                 "capabilities", "plugin_of", "_owner", "_kernels_from"):
        clean.setattr(hal.PluginManager, name, boom)  # every answer of the manager ...
    class NoHooks:
        def __getattr__(self, name):
            boom()

    clean.setattr(pm.pm, "hook", NoHooks())  # ... and the pluggy manager's hook relay
    fake.frozen = True
    x = torch.randn(3, 8)
    hal.ops.gelu(x)
    hal.ops.rms_norm(x, torch.ones(8))
    hal.ops.linear(x, torch.randn(4, 8))
    hal.ops.softmax(x)
    acc.synchronize()
    acc.memory_allocated()
    acc.current_device_index()
    acc.manual_seed(1)
    ev0, ev1 = acc.Event(enable_timing=True), acc.Event(enable_timing=True)
    ev0.record()
    ev1.record()
    assert ev0.elapsed_time(ev1) >= 0.0
    assert hal.accelerator() is acc and acc.describe()["chip"] == "cuda"


def test_describe_labels_emulated_chips(clean):
    use(FakeChips(native=("cuda",)))
    emu = hal.bind("ascend", emulated=True)
    d = emu.describe()
    assert d["emulated"] is True and d["chip"] == "ascend" and d["plugin"] == "fakechips"
    assert d["device"] == "cpu" and d["torch_device_type"] == "cpu" and "emulated" in repr(emu)
    assert isinstance(emu.runtime, hal.EmulatedRuntime) and emu.runtime.chip == "ascend"
    assert "emulated" in emu.capabilities.source
    native = hal.bind("cuda")
    assert native.describe()["emulated"] is False and "native" in repr(native)
    cpu = hal.bind("cpu")
    assert cpu.describe()["emulated"] is False
    assert "torch.gelu" in cpu.describe()["kernels"]["gelu"]  # overridden kernels are reported


@pytest.mark.parametrize("chip,emulated", [("cpu", False), ("cpu", True), ("ascend", True), ("cuda", False)])
def test_manual_seed_makes_runs_repeat(clean, chip, emulated):
    fake = FakeChips(native=("cuda",))
    use(fake)
    acc = hal.bind(chip, emulated=emulated)
    acc.manual_seed(1234)
    a = torch.randn(16)
    acc.manual_seed(1234)
    b = torch.randn(16)
    acc.manual_seed(1235)
    c = torch.randn(16)
    assert torch.equal(a, b) and not torch.equal(a, c)
    if chip == "cuda":
        assert ("manual_seed", 1234) in fake.runtimes[-1].calls  # the chip's own generator too
