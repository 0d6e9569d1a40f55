"""Device runtimes: CpuRuntime (the cpu chip), EmulatedRuntime's speed dilation, CpuStream/CpuEvent,
and TorchDeviceRuntime over a stand-in device module.

Clocks are stubbed wherever a duration is checked: no assertion here depends on wall-clock time.
TorchDeviceRuntime is exercised through a stand-in module that records calls; it follows the function
names of torch.cuda in torch 2.13 (torch/cuda/__init__.py: device_count, current_device, set_device,
synchronize, current_stream, Stream, Event, manual_seed; torch/cuda/memory.py: memory_allocated,
max_memory_allocated, memory_reserved, reset_peak_memory_stats, memory_stats, mem_get_info), which
torch_npu's torch.npu mirrors.
"""
from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
import torch

import hal
from hal.emulation import runtime
from hal.contract.runtime import TorchDeviceRuntime
from hal.emulation.runtime import CpuEvent, CpuRuntime, CpuStream, EmulatedRuntime

_acc_module = importlib.import_module("hal.core.selection")
MiB = 1 << 20


# ---- CpuRuntime --------------------------------------------------------------------------------
def test_cpu_runtime_is_one_host_device():
    rt = CpuRuntime()
    assert rt.device_count() == 1 and rt.current_device_index() == 0
    assert rt.device() == torch.device("cpu") and rt.device(3) == torch.device("cpu")
    rt.set_device_index(5)  # every local rank shares the host
    with pytest.raises(ValueError, match="device index must be >= 0, got -1"):
        rt.set_device_index(-1)
    assert rt.synchronize() is None
    assert isinstance(rt.current_stream(), CpuStream) and rt.current_stream().query()
    assert {torch.float32, torch.float16, torch.bfloat16, torch.float64} <= set(rt.supported_dtypes())
    t = torch.arange(6.0).reshape(2, 3).t()
    pinned = rt.pin_memory(t)
    assert torch.equal(pinned, t) and (torch.cuda.is_available() or pinned.is_contiguous())


def test_cpu_memory_stats_move_when_a_large_tensor_is_touched():
    rt = CpuRuntime()
    rt.reset_peak_memory_stats()
    before = rt.memory_allocated()
    big = torch.ones(64 * MiB // 4)  # 64 MiB, every page written
    after = rt.memory_allocated()
    assert after - before >= 48 * MiB, (before, after)  # resident set grew by most of it
    assert rt.max_memory_allocated() >= after
    stats = rt.memory_stats()
    assert stats["allocated_bytes.all.peak"] >= stats["allocated_bytes.all.current"] >= 48 * MiB
    assert "resident" in stats["source"] and rt.memory_reserved() > 0
    free, total = rt.get_memory_info()
    assert 0 < free <= total
    del big


def test_reset_peak_memory_stats_forgets_the_peak():
    rt = CpuRuntime()
    low = rt.memory_allocated()
    big = torch.ones(64 * MiB // 4)
    high = rt.max_memory_allocated()
    del big  # a 64 MiB block is mmap'd by malloc, so freeing it returns the pages
    assert rt.max_memory_allocated() >= high  # the peak is remembered ...
    rt.reset_peak_memory_stats()
    assert rt.max_memory_allocated() <= high - 32 * MiB, (low, high)  # ... until reset


def test_cpu_manual_seed_is_torch_seed():
    rt = CpuRuntime()
    rt.manual_seed(99)
    a = torch.rand(8)
    rt.manual_seed(99)
    assert torch.equal(a, torch.rand(8))


# ---- CpuStream / CpuEvent ----------------------------------------------------------------------
def test_cpu_event_elapsed_time_is_milliseconds(monkeypatch):
    clock = iter([100.0, 100.25])
    monkeypatch.setattr(runtime, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    start, end = CpuEvent(enable_timing=True), CpuEvent(enable_timing=True)
    assert not start.query()
    start.record()
    end.record(CpuStream())
    assert start.query() and end.query()
    assert start.elapsed_time(end) == pytest.approx(250.0)


def test_cpu_event_needs_both_records():
    start, end = CpuEvent(enable_timing=True), CpuEvent(enable_timing=True)
    start.record()
    with pytest.raises(RuntimeError, match="both events must be recorded"):
        start.elapsed_time(end)


def test_cpu_stream_interface():
    s = CpuStream(priority=-1)
    assert s.device == torch.device("cpu") and s.priority == -1 and s.query()
    ev = s.record_event()
    assert isinstance(ev, CpuEvent) and ev.query()
    s.wait_event(ev)
    s.wait_stream(CpuStream())
    with s as entered:
        assert entered is s
    mine = CpuEvent()
    assert s.record_event(mine) is mine and mine.query()


# ---- EmulatedRuntime: speed dilation -----------------------------------------------------------
class FakeClock:
    """process_time advances by the CPU time each step says; sleep is recorded (and costs a little
    CPU time itself, which must not be counted as work)."""

    def __init__(self, work: list[float], sleep_cpu: float = 0.01):
        self.now, self.work, self.sleep_cpu, self.slept = 0.0, list(work), sleep_cpu, []

    def process_time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += self.sleep_cpu

    def do_work(self) -> None:
        self.now += self.work.pop(0)


@pytest.mark.parametrize("dilation", [1.5, 3.0, 7.25])
def test_emulated_sleep_is_proportional_to_cpu_time(monkeypatch, dilation):
    clock = FakeClock(work=[0.5, 0.2, 0.0, 1.3])
    monkeypatch.setattr(runtime, "time", clock)
    rt = EmulatedRuntime("slowchip", dilation=dilation)
    for _ in range(4):
        clock.do_work()
        rt.synchronize()
    # Work of 0.5, 0.2, 0 and 1.3 s of CPU: sleeps of (d - 1) x each, none for no work, and the
    # CPU time spent in the sleep call itself is not counted as the next interval's work.
    assert clock.slept == pytest.approx([(dilation - 1) * w for w in (0.5, 0.2, 1.3)])


def test_emulated_without_dilation_uses_the_plain_synchronize(monkeypatch):
    clock = FakeClock(work=[5.0])
    monkeypatch.setattr(runtime, "time", clock)
    rt = EmulatedRuntime("fastchip")
    clock.do_work()
    rt.synchronize()
    assert clock.slept == [] and rt.dilation == 1.0 and rt.device_count() == 1


class PeakChips:
    """Two test chips whose bf16 peaks differ 4x (the plugin hooks the HAL needs for emulation)."""

    __name__ = "peakchips"
    PEAKS = {"fast": 400e12, "slow": 100e12}

    @hal.hookimpl
    def hal_plugin_info(self):
        return hal.PluginInfo(name="peakchips", version="0", contract_version=hal.CONTRACT_VERSION)

    @hal.hookimpl
    def hal_chips(self):
        return [hal.ChipSpec(name=c, vendor="test", torch_device_type="cpu", ccl_backend="gloo") for c in self.PEAKS]

    @hal.hookimpl
    def hal_native_available(self, chip):
        return False

    @hal.hookimpl
    def hal_chip_profile(self, chip, model):
        u = hal.unknown
        return hal.ChipProfile(chip=chip, model=f"{chip} model",
                               peak_flops={"bfloat16": hal.Figure(value=self.PEAKS[chip], unit="FLOP/s", source="test")},
                               memory_bytes=u("B"), memory_bandwidth=u("B/s"), intra_node_bandwidth=u("B/s"),
                               nic_bandwidth=u("B/s"))

    @hal.hookimpl
    def hal_device_runtime(self, chip):
        raise AssertionError("emulated chips never ask for the native runtime")

    @hal.hookimpl
    def hal_create_process_group(self, chip, store, rank, world_size, timeout):
        raise NotImplementedError

    @hal.hookimpl
    def hal_collective_capabilities(self, chip):
        return hal.CapabilityMatrix(chip=chip, source="test")


@pytest.fixture
def peak_chips(monkeypatch):
    for var in ("HAL_CHIP", "HAL_CLUSTER", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    import hal_cpu
    pm, prev = _acc_module.get_plugin_manager(), hal.bound()
    fresh = hal.PluginManager()
    fresh.register(hal_cpu)
    fresh.register(PeakChips())
    hal.set_plugin_manager(fresh)
    hal.reset()
    yield monkeypatch
    hal.set_plugin_manager(pm)
    hal.reset()
    if prev is not None:
        _acc_module._BOUND = prev
        hal.ops.bind(prev.kernels)


@pytest.mark.parametrize("rank,chip,dilation", [(0, "fast", 1.0), (1, "slow", 4.0)])
def test_accelerator_dilates_the_slower_emulated_chip(peak_chips, rank, chip, dilation):
    peak_chips.setenv("HAL_EMULATE", "fast:1,slow:1")
    peak_chips.setenv("HAL_EMULATE_DILATION", "1")
    peak_chips.setenv("RANK", str(rank))
    peak_chips.setenv("WORLD_SIZE", "2")
    clock = FakeClock(work=[0.3])
    peak_chips.setattr(runtime, "time", clock)
    acc = hal.accelerator()
    assert (acc.chip.name, acc.emulated) == (chip, True)
    assert acc.runtime.dilation == pytest.approx(dilation)  # 400 / 100 TFLOP/s for the slow chip
    clock.do_work()
    acc.synchronize()  # the bound attribute is the dilated one
    assert clock.slept == ([pytest.approx(0.3 * 3.0)] if dilation > 1 else [])


def test_dilation_is_off_unless_asked(peak_chips):
    peak_chips.setenv("HAL_EMULATE", "fast:1,slow:1")
    peak_chips.setenv("RANK", "1")
    for off in ("0", "off", ""):
        peak_chips.setenv("HAL_EMULATE_DILATION", off)
        hal.reset()
        assert hal.accelerator().runtime.dilation == 1.0


# ---- TorchDeviceRuntime ------------------------------------------------------------------------
def _stand_in_module(calls: list) -> SimpleNamespace:
    def rec(name, result=None):
        def fn(*args, **kwargs):
            calls.append((name, args))
            return result
        return fn

    class Stream:  # classes are passed through, not called
        pass

    class Event:
        pass

    return SimpleNamespace(
        Stream=Stream, Event=Event, device_count=rec("device_count", 8), current_device=rec("current_device", 3),
        set_device=rec("set_device"), synchronize=rec("synchronize"), current_stream=rec("current_stream", "s0"),
        memory_allocated=rec("memory_allocated", 11), max_memory_allocated=rec("max_memory_allocated", 22),
        memory_reserved=rec("memory_reserved", 33), reset_peak_memory_stats=rec("reset_peak_memory_stats"),
        memory_stats=rec("memory_stats", {"x": 1}), mem_get_info=rec("mem_get_info", (5, 10)),
        manual_seed=rec("manual_seed"))


def test_torch_device_runtime_forwards_to_the_module():
    calls: list = []
    mod = _stand_in_module(calls)
    rt = TorchDeviceRuntime(mod, "cuda")
    assert rt.Stream is mod.Stream and rt.Event is mod.Event and rt.device_type == "cuda"
    assert rt.device_count() == 8
    rt.set_device_index(2)
    assert rt.device() == torch.device("cuda", 3)  # the module's current_device()
    assert rt.device(1) == torch.device("cuda", 1)
    rt.synchronize()
    assert rt.current_stream() == "s0"
    assert (rt.memory_allocated(), rt.max_memory_allocated(), rt.memory_reserved()) == (11, 22, 33)
    rt.reset_peak_memory_stats()
    assert rt.memory_stats() == {"x": 1} and rt.get_memory_info() == (5, 10)
    rt.manual_seed(7)
    names = [c[0] for c in calls]
    assert names == ["device_count", "set_device", "current_device", "synchronize", "current_stream",
                     "memory_allocated", "max_memory_allocated", "memory_reserved", "reset_peak_memory_stats",
                     "memory_stats", "mem_get_info", "manual_seed"]
    assert ("set_device", (2,)) in calls and ("manual_seed", (7,)) in calls
    assert rt.supported_dtypes() == DeviceDefault.dtypes
    assert TorchDeviceRuntime(mod, "cuda", dtypes=(torch.float16,)).supported_dtypes() == (torch.float16,)


class DeviceDefault:
    dtypes = hal.DeviceRuntime().supported_dtypes()


def test_base_runtime_methods_are_abstract():
    rt = hal.DeviceRuntime()
    for name in ("device_count", "current_device_index", "synchronize", "memory_allocated", "get_memory_info"):
        with pytest.raises(NotImplementedError):
            getattr(rt, name)()


def test_torch_device_runtime_refuses_a_module_without_cudas_functions():
    # torch.cpu has device_count/synchronize/Stream but no memory statistics or manual_seed (torch 2.13)
    with pytest.raises(hal.NotSupportedError) as err:
        TorchDeviceRuntime(torch.cpu, "cpu")
    msg = str(err.value)
    assert "TorchDeviceRuntime(torch.cpu, 'cpu')" in msg and "hal.CpuRuntime()" in msg
    for fn in ("memory_allocated", "mem_get_info", "manual_seed"):
        assert fn in msg
    assert "synchronize" not in msg and "device_count" not in msg


def test_torch_device_runtime_subclass_may_define_what_the_module_lacks():
    calls: list = []
    mod = _stand_in_module(calls)
    del mod.mem_get_info, mod.manual_seed

    class Partial(TorchDeviceRuntime):
        def get_memory_info(self):
            return (1, 2)

    with pytest.raises(hal.NotSupportedError, match=r"lacks manual_seed \(torch.cuda's names\); subclass"):
        Partial(mod, "acme")

    class Complete(Partial):
        def manual_seed(self, seed):
            calls.append(("own_seed", (seed,)))

    rt = Complete(mod, "acme")
    assert rt.get_memory_info() == (1, 2) and rt.device_count() == 8
    rt.manual_seed(3)
    assert ("own_seed", (3,)) in calls
