"""Timed emulation (hal.emulation.timed): what an op is charged (at its own dtype's rate), the two chips' ratio,
backward charged, sync and
overrun on an injected fake clock (nothing here sleeps or reads wall time), env errors, binding, and
one 2-rank run where collectives pass through the clock."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import hal
from hal.core import catalog
from hal.emulation import timed
from hal.emulation.timed import Speeds, TimedEmulationError, VirtualClock, chip_speeds

# compute-bound speeds for charge tests: the bytes term is negligible
COMPUTE = Speeds(flops_per_s=1e9, bytes_per_s=1e18, source="test: compute-bound")
MEMORY = Speeds(flops_per_s=1e18, bytes_per_s=1e6, source="test: memory-bound")


class FakeTime:
    """now() returns `t`; sleep(s) records s and advances `t` by it."""

    def __init__(self, t: float = 100.0):
        self.t = t
        self.slept: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


def _clock(speeds=COMPUTE, chip="test", ft=None):
    ft = ft or FakeTime()
    return VirtualClock(chip, speeds, now=ft.now, sleep=ft.sleep), ft


# ---- what an op costs ---------------------------------------------------------------------------
def test_mm_is_charged_2mnk_over_the_flop_rate():
    m, k, n = 8, 16, 32
    a, b = torch.randn(m, k), torch.randn(k, n)
    clock, _ = _clock()
    with timed.timed(clock):
        torch.mm(a, b)
    st = clock.stats()
    assert st["flops"] == 2 * m * n * k
    assert st["bytes"] == 4 * (m * k + k * n + m * n)
    assert st["busy_s"] == pytest.approx(2 * m * n * k / COMPUTE.flops_per_s)
    assert st["ops"] == 1


def test_memory_bound_op_is_charged_its_bytes():
    x = torch.randn(1000)
    clock, _ = _clock(MEMORY)
    with timed.timed(clock):
        torch.relu(x)
    assert clock.stats()["bytes"] == 8000  # 4000 in, 4000 out
    assert clock.stats()["busy_s"] == pytest.approx(8000 / MEMORY.bytes_per_s)


def test_views_and_allocations_are_free():
    x = torch.randn(4, 6)
    clock, _ = _clock(MEMORY)
    with timed.timed(clock):
        x.view(6, 4).t()
        x.detach()
        torch.empty(100)
        torch.nn.Linear(64, 64, device="meta")(torch.empty(8, 64, device="meta"))  # shapes only
    assert clock.stats()["ops"] == 0 and clock.stats()["busy_s"] == 0


def test_addmm_bmm_and_cpu_attention_follow_torchs_formulas():
    from torch.utils.flop_counter import sdpa_flop_count
    bias, a, b = torch.randn(5), torch.randn(3, 4), torch.randn(4, 5)
    x, y = torch.randn(2, 3, 4), torch.randn(2, 4, 6)
    q = torch.randn(1, 2, 8, 4)
    clock, _ = _clock()
    with timed.timed(clock):
        torch.addmm(bias, a, b)
        torch.bmm(x, y)
    assert clock.stats()["flops"] == 2 * 3 * 4 * 5 + 2 * 2 * 3 * 4 * 6
    clock.reset_stats()
    with timed.timed(clock):
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert clock.stats()["flops"] == sdpa_flop_count(q.shape, q.shape, q.shape) > 0


def test_backward_is_charged():
    m, k, n = 4, 8, 16
    x, w = torch.randn(m, k, requires_grad=True), torch.randn(k, n, requires_grad=True)
    clock, _ = _clock()
    with timed.timed(clock):
        y = x @ w
        forward = clock.stats()["flops"]
        y.sum().backward()
    assert forward == 2 * m * n * k
    assert clock.stats()["flops"] == 3 * 2 * m * n * k  # dX = dY W^T and dW = X^T dY


# ---- the chips' speeds ----------------------------------------------------------------------------
def test_chip_speeds_is_the_catalog_peak_times_the_matrix_best_fraction_over_the_scale():
    h100 = catalog.default("cuda")
    mx = catalog.matrix("cuda", "H100")
    sp = chip_speeds("cuda", "bfloat16", 1e5)
    f, b, src = sp
    assert f == pytest.approx(h100.peak("bfloat16") * mx.best_fraction / 1e5)
    assert b == pytest.approx(h100.memory_bandwidth.value * mx.memory / 1e5)
    assert "catalog" in src and "best GEMM fraction" in src
    assert sp.matrix is mx and sp.peak_flops_per_s == pytest.approx(h100.peak("bfloat16") / 1e5)


def test_charged_op_times_follow_the_matrix():
    """Each GEMM / attention op a timed-emulated chip runs is charged the seconds the chip's efficiency
    matrix gives for its shape (ratio within 2%), and small GEMMs are slower per FLOP than large ones."""
    from hal.core.chip_matrix import ChipMatrix
    mx = ChipMatrix(chip="t", model="T", gemm_peak=0.8, gemm_half_dim=128, attention=0.5, memory=1.0,
                    intra_link=1.0, nic_link=1.0, intra_latency_s=0.0, nic_latency_s=0.0,
                    memory_reserve_bytes=0.0, memory_fragmentation=0.0)
    peak = 1e10
    sp = Speeds(0.8 * peak, 1e18, "test", mx, peak)      # F = best fraction x peak; bytes free
    cases = [(256, 512, 128), (64, 96, 32), (300, 17, 1024)]
    for m, n, k in cases:
        clock, _ = _clock(sp)
        a, b = torch.randn(m, k), torch.randn(k, n)
        with timed.timed(clock):
            a @ b
        want = 2 * m * n * k / (peak * mx.gemm_fraction(m, n, k))
        assert clock.stats()["busy_s"] / want == pytest.approx(1.0, abs=0.02), (m, n, k)
    q = torch.randn(2, 4, 64, 32)
    flops = 4 * 2 * 4 * 64 * 64 * 32                       # QK^T and AV over every key (torch's count)
    for causal, share in ((False, 1.0), (True, 65 / 128)):  # causal as FlashAttention counts it: s(s+1)/2 of s^2
        clock, _ = _clock(sp)
        with timed.timed(clock):
            F.scaled_dot_product_attention(q, q, q, is_causal=causal)
        assert clock.stats()["flops"] == flops              # the model-FLOPs count is torch's, whatever is_causal
        want = flops * share / (peak * mx.attention)
        assert clock.stats()["busy_s"] / want == pytest.approx(1.0, abs=0.02), causal


def test_a_fused_causal_sdpa_is_charged_about_half_and_the_unfused_one_all():
    """A fused SDPA kernel (torch's CPU flash kernel here; the flash / efficient / cuDNN ones carry is_causal the
    same way) with is_causal=True is charged s(s+1)/(2 s^2) of its non-causal seconds, forward and backward;
    the math path (unfused: two GEMMs over the whole s x s matrix, masked after) is charged the same either way."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    busy = {}
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.MATH):
        for causal in (False, True):
            q = torch.randn(1, 2, 32, 16, requires_grad=True)
            clock, _ = _clock()
            with sdpa_kernel(backend), timed.timed(clock):
                F.scaled_dot_product_attention(q, q, q, is_causal=causal).sum().backward()
            busy[backend, causal] = clock.stats()["busy_s"]
    fl = SDPBackend.FLASH_ATTENTION
    assert busy[fl, True] / busy[fl, False] == pytest.approx(33 / 64, rel=1e-3)
    assert busy[SDPBackend.MATH, True] == pytest.approx(busy[SDPBackend.MATH, False], rel=0.02)


def test_two_chips_virtual_times_are_in_their_profile_ratio_and_the_same_torch_ops_keep_it():
    cuda, ascend = chip_speeds("cuda", "bfloat16", 1e4), chip_speeds("ascend", "bfloat16", 1e4)
    ops = [(2 * 64 * 64 * 64, 3 * 64 * 64 * 4), (0, 4e6), (5e12, 1e3), (1e9, 1e9)]
    clocks = {}
    for name, sp in (("cuda", cuda), ("ascend", ascend)):
        clocks[name], _ = _clock(sp, name)
        for f, b in ops:
            clocks[name].charge(f, b)
    expected = sum(max(f / ascend.flops_per_s, b / ascend.bytes_per_s) for f, b in ops) / \
        sum(max(f / cuda.flops_per_s, b / cuda.bytes_per_s) for f, b in ops)
    assert clocks["ascend"].stats()["busy_s"] / clocks["cuda"].stats()["busy_s"] == pytest.approx(expected)
    # compute-bound work alone: the bf16 peak ratio of H100 and 910B2
    a, _ = _clock(ascend)
    c, _ = _clock(cuda)
    a.charge(5e12, 0)
    c.charge(5e12, 0)
    best = {c: catalog.default(c).peak("bfloat16") * catalog.matrix(c).best_fraction for c in ("cuda", "ascend")}
    assert a.stats()["busy_s"] / c.stats()["busy_s"] == pytest.approx(best["cuda"] / best["ascend"])
    # the same torch ops (bfloat16: the 910B2 has no float32 figure) on both chips
    busy = {}
    for name, sp in (("cuda", cuda), ("ascend", ascend)):
        x = torch.randn(16, 32, dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(32, 64, dtype=torch.bfloat16, requires_grad=True)
        clock, _ = _clock(sp, name)
        with timed.timed(clock):
            (x @ w).relu().sum().backward()
        busy[name] = clock.stats()
    assert busy["cuda"]["flops"] == pytest.approx(busy["ascend"]["flops"]) and busy["cuda"]["bytes"] == busy["ascend"]["bytes"]
    assert busy["ascend"]["busy_s"] > busy["cuda"]["busy_s"]


def test_each_op_is_charged_at_the_rate_of_its_own_dtype():
    """A bf16, an fp16 and an fp32 matmul of one shape on one emulated H100 are charged in the ratio of the
    catalog matrix's rates (peak(dtype) x best fraction; within 2%); an op in a dtype the chip has no figure
    for is refused naming chip, op and dtype; HAL_EMULATE_TIMED_DTYPE's re-mapping is explicit."""
    sp = chip_speeds("cuda", None, 1e4)
    mx, h100 = catalog.matrix("cuda", "H100"), catalog.default("cuda")
    busy = {}
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        clock, _ = _clock(sp, "cuda")
        a = torch.ones(256, 256, dtype=dt)  # 2 x 256^3 FLOPs over 3 x 256^2 elements: compute-bound on the clock
        with timed.timed(clock):
            a @ a
        busy[str(dt)[6:]] = clock.stats()["busy_s"]
    assert sp.dtype == "bfloat16" and sp.rates["float32"] == pytest.approx(h100.peak("float32") * mx.best_fraction / 1e4)
    assert busy["float32"] / busy["bfloat16"] == pytest.approx(h100.peak("bfloat16") / h100.peak("float32"), rel=0.02)
    assert busy["float16"] / busy["bfloat16"] == pytest.approx(h100.peak("bfloat16") / h100.peak("float16"), rel=0.02)
    x = torch.ones(64, 64)
    clock, _ = _clock(chip_speeds(catalog.default("ascend"), None, 1e4), "ascend")
    with pytest.raises(TimedEmulationError, match=r"chip 'ascend \(.*910B2\)': op 'mm' computes in float32"):
        with timed.timed(clock):
            x @ x
    forced, remap = timed.charge_plan("cuda:float16, ascend:float32=bfloat16", "ascend", "Huawei Ascend 910B2")
    assert (forced, remap) == (None, {"float32": "bfloat16"})
    ascend = chip_speeds("ascend", None, 1e4, charge_as=remap)
    assert ascend.flops_for("float32", "mm") == ascend.rates["bfloat16"] and "float32->bfloat16" in ascend.source
    with pytest.raises(TimedEmulationError, match="no FLOP/s figure for"):
        chip_speeds("ascend", None, 1e4, charge_as={"float16": "float32"})


def test_unknown_figures_are_named_not_invented():
    with pytest.raises(TimedEmulationError, match="float32"):
        chip_speeds("ascend", "float32", 1.0)  # the catalog has no 910B2 float32 peak
    f, b, src = chip_speeds("kunlun", "bfloat16", 1.0)  # P800: every figure unknown in the catalog
    assert f == pytest.approx(catalog.matrix("kunlun").best_fraction * timed.ASSUMED["P800"]["peak_bf16"][0])
    assert "assumed" in src
    with pytest.raises(TimedEmulationError, match="dtype 'fp8'"):
        chip_speeds("cuda", "fp8", 1.0)


def test_a_measured_efficiency_matrix_replaces_the_catalog():
    from hal.core.efficiency import BandwidthFigure, EfficiencyMatrix, MatmulFigure
    m = EfficiencyMatrix(chip="cuda", plugin="p", profile_model="H100", emulated=False, device="cuda:0",
                         ccl="nccl", torch_version="x", host="h", measured_at="t",
                         matmul=[MatmulFigure(dtype="bfloat16", m=8, n=8, k=8, flops_per_s=600e12,
                                              seconds_median=1, repeats=1)],
                         memory_bandwidth=[BandwidthFigure(bytes=1, bytes_per_s=3e12, seconds_median=1, repeats=1)])
    f, b, src = chip_speeds("cuda", "bfloat16", 10.0, matrix=m)
    assert (f, b) == (pytest.approx(60e12), pytest.approx(3e11)) and "measured" in src


# ---- synchronisation and overrun (fake time) ---------------------------------------------------------
def test_sync_sleeps_until_the_device_is_done():
    clock, ft = _clock()
    clock.charge(2e9, 0)  # 2 s of device work, issued at t=100
    ft.t += 0.5           # the host spent 0.5 s
    clock.sync()
    assert ft.slept == [pytest.approx(1.5)] and ft.t == pytest.approx(102.0)
    clock.charge(1e9, 0)  # the next interval starts where the device stopped
    clock.sync()
    assert ft.slept[-1] == pytest.approx(1.0)
    assert clock.stats()["overrun_count"] == 0 and clock.stats()["max_host_fraction"] == pytest.approx(0.25)


def test_a_host_slower_than_the_chip_is_an_overrun_not_silence():
    clock, ft = _clock()
    clock.charge(1e9, 0)  # 1 s of work issued at t=100
    ft.t += 1.5
    clock.charge(0, 0)  # the host issues its next op at 101.5: the device sat idle for it
    ft.t += 1.5
    with pytest.warns(timed.TimedEmulationOverrunWarning, match="HAL_EMULATE_TIME_SCALE"):
        clock.sync()
    st = clock.stats()
    assert ft.slept == [] and st["overrun_count"] == 1 and st["overrun_s"] == pytest.approx(2.0)
    assert clock.device_t == ft.t  # the step took the host's time
    clock.charge(1e9, 0)
    ft.t += 2.0
    clock.charge(1e9, 0)  # issued 1 s after the device ran out of work
    ft.t += 0.5
    clock.sync()  # warned once per clock; still counted
    assert clock.stats()["overrun_count"] == 2 and clock.stats()["overrun_s"] == pytest.approx(2.0 + 0.5)


def test_host_only_work_after_the_last_op_is_a_gap_not_an_overrun():
    clock, ft = _clock()
    clock.completed()
    ft.t += 0.01
    clock.sync()  # Python between two collectives, nothing charged
    assert clock.stats()["overrun_count"] == 0 and clock.stats()["host_gap_s"] == pytest.approx(0.01)
    clock.charge(1e9, 0)  # 1 s issued while the host is ahead ...
    ft.t += 3.0           # ... then 3 s of host-only work (I/O)
    clock.sync()
    st = clock.stats()
    assert st["overrun_count"] == 0 and st["host_gap_s"] == pytest.approx(2.01) and ft.slept == []


def test_item_synchronises(monkeypatch):
    clock, ft = _clock(MEMORY)
    x = torch.randn(1000)
    with timed.timed(clock):
        s = x.sum()
        assert ft.slept == []
        s.item()
    assert ft.slept == [pytest.approx(clock.stats()["busy_s"])]


def test_idle_moves_the_device_without_an_overrun():
    clock, ft = _clock()
    clock.charge(1e9, 0)
    ft.t += 5.0
    clock.idle()
    clock.sync()
    assert clock.stats()["overrun_count"] == 0 and ft.slept == []


# ---- environment and binding -----------------------------------------------------------------------
@pytest.mark.parametrize("var,value,match", [
    ("HAL_EMULATE_TIME_SCALE", "fast", "not a number"),
    ("HAL_EMULATE_TIME_SCALE", "0", "> 0"),
    ("HAL_EMULATE_TIME_SCALE", "-3", "> 0"),
    ("HAL_EMULATE_TIME_SCALE", "inf", "finite"),
    ("HAL_EMULATE_TIMED", "maybe", "expected 1/0"),
    ("HAL_EMULATE_TIMED_DTYPE", "bf16", "not one of"),
    ("HAL_EMULATE_TIMED_MATRIX", "/nonexistent/m.json", "no such file"),
])
def test_env_errors_are_typed_and_name_the_variable(var, value, match):
    env = {"HAL_EMULATE_TIMED": "1", var: value}
    with pytest.raises(TimedEmulationError, match=match) as info:
        timed.clock_from_env("cuda", catalog.default("cuda"), env)
    assert var in str(info.value)


def test_timed_is_off_unless_asked():
    for off in ("", "0", "off", "false"):
        assert timed.clock_from_env("cuda", catalog.default("cuda"), {"HAL_EMULATE_TIMED": off}) is None


@pytest.fixture
def rebind(monkeypatch):
    for var in ("HAL_CHIP", "HAL_CLUSTER", "RANK", "WORLD_SIZE", "HAL_EMULATE_DILATION", "HAL_EMULATE_TIMED"):
        monkeypatch.delenv(var, raising=False)
    prev = hal.bound()
    hal.reset()
    yield monkeypatch
    hal.reset()
    assert timed.active_clock() is None
    if prev is not None:
        import hal.core.selection as sel
        sel._BOUND = prev
        hal.ops.bind(prev.kernels)


def test_timed_and_dilation_together_are_refused(rebind):
    rebind.setenv("HAL_EMULATE", "cuda:1,ascend:1")
    rebind.setenv("RANK", "1")
    rebind.setenv("HAL_EMULATE_TIMED", "1")
    rebind.setenv("HAL_EMULATE_DILATION", "1")
    with pytest.raises(TimedEmulationError, match="exclusive"):
        hal.accelerator()
    assert timed.active_clock() is None


def test_binding_with_timed_installs_the_clock(rebind):
    rebind.setenv("HAL_EMULATE", "cuda:1,ascend:1")
    rebind.setenv("RANK", "1")
    rebind.setenv("HAL_EMULATE_TIMED", "1")
    rebind.setenv("HAL_EMULATE_TIME_SCALE", "1e6")
    acc = hal.accelerator()
    clock = timed.active_clock()
    assert acc.chip.name == "ascend" and acc.runtime.clock is clock and acc.runtime.dilation == 1.0
    assert clock.scale == 1e6 and clock.speeds == chip_speeds(acc.profile, "bfloat16", 1e6)
    ft = FakeTime()
    clock._now, clock._sleep = ft.now, ft.sleep  # no real sleeping below
    clock._mark(ft.t)
    start = acc.Event(enable_timing=True)
    start.record()
    torch.ones(64, 64, dtype=torch.bfloat16) @ torch.ones(64, 64, dtype=torch.bfloat16)  # charged: the mode is on
    end = acc.Event(enable_timing=True)
    end.record()
    assert clock.stats()["flops"] >= 2 * 64 ** 3
    assert end.elapsed_time(start) < 0 < start.elapsed_time(end)
    assert start.elapsed_time(end) == pytest.approx((clock.device_t - ft.t) * 1e3)
    acc.synchronize()
    assert ft.slept and ft.t == pytest.approx(clock.device_t)
    hal.reset()
    assert timed.active_clock() is None
    n = clock.stats()["ops"]
    torch.randn(8) + 1  # after reset: not charged
    assert clock.stats()["ops"] == n


def test_a_scale_chosen_for_the_default_is_a_number():
    assert math.isfinite(timed.DEFAULT_TIME_SCALE) and timed.DEFAULT_TIME_SCALE > 1


# ---- two ranks: collectives go through the clock ---------------------------------------------------
def rank_case() -> dict:
    import torch.distributed as dist
    from datetime import timedelta
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    acc = hal.accelerator()
    clock = timed.active_clock()
    # fake time: the check is on the accounting, not on wall seconds
    ft = FakeTime(1000.0)
    clock._now, clock._sleep = ft.now, ft.sleep
    clock._mark(ft.t)
    clock.reset_stats()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
    model(torch.randn(4, 16)).sum().backward()
    t = torch.ones(4)
    dist.all_reduce(t)
    st = clock.stats()
    return {"chip": acc.chip.name, "syncs": st["syncs"], "flops": st["flops"], "slept": sum(ft.slept),
            "busy": st["busy_s"], "sum": t.tolist(), "overruns": st["overrun_count"]}


def test_two_ranks_collectives_synchronise_and_backward_under_ddp_is_charged():
    from hal.testing import WorkerPool
    env = {"HAL_EMULATE": "cuda:1,ascend:1", "HAL_EMULATE_TIMED": "1", "HAL_EMULATE_TIME_SCALE": "1e7",
           "OMP_NUM_THREADS": "1", "HAL_EMULATE_TIMED_DTYPE": "bfloat16"}  # float32 ops at bf16: forced, explicit
    with WorkerPool(2, env=env) as pool:
        res = pool.run(rank_case, timeout=120)
    assert [r["chip"] for r in res] == ["cuda", "ascend"]
    for r in res:
        assert r["sum"] == [2.0] * 4
        assert r["syncs"] >= 2  # DDP's gradient all_reduce and ours synchronised with the device
        assert r["flops"] == 2 * 2 * 4 * 16 * 16  # forward addmm + the weight gradient's mm (x needs none)
        assert r["slept"] == pytest.approx(r["busy"])  # the fake host was infinitely fast: it slept it all
        assert r["overruns"] == 0
    assert res[1]["busy"] > res[0]["busy"]  # 910B2 is slower than H100


def test_a_recorded_trace_is_priced_as_the_clock_charges():
    x = torch.randn(8, 16, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(16, 4, dtype=torch.bfloat16, requires_grad=True)
    trace = timed.record_ops(lambda: (x @ w).relu().sum().backward())
    assert [(op, o.dtype) for o in trace for op, _, _ in [o] if op == "mm"] == [("mm", "bfloat16")] * 3
    sp = chip_speeds("ascend", "bfloat16", 1e4)
    x.grad = w.grad = None
    clock, _ = _clock(sp)
    with timed.timed(clock):
        (x @ w).relu().sum().backward()
    assert timed.trace_cost(trace, sp) == pytest.approx(clock.stats()["busy_s"])


def test_a_late_item_leaves_the_timeline_to_the_next_hard_sync():
    clock, ft = _clock()
    clock.charge(1e9, 0)      # 1 s issued at t=100
    ft.t += 0.2
    clock.charge(0, 0)
    ft.t += 1.0               # the host reads a value at 101.2: late by 0.2 s
    clock.sync(soft=True)
    assert clock.device_t == pytest.approx(101.0) and clock.stats()["overrun_count"] == 0
    clock.charge(2e9, 0)      # the device timeline goes on from 101: the host catches up
    clock.sync()
    assert clock.stats()["overrun_count"] == 0 and ft.t == pytest.approx(103.0)


class _Future:
    def __init__(self):
        self.callbacks = []

    def add_done_callback(self, cb):
        self.callbacks.append(cb)


class _Work:
    def __init__(self):
        self.fut = _Future()

    def get_future(self):
        return self.fut

    def is_completed(self):
        return False


class _PythonGroup:
    """Stands in for a Python ProcessGroup subclass (ccl_bridge's): torch calls its methods directly."""

    def __init__(self):
        self.calls = []

    def allreduce(self, tensors, opts=None):
        self.calls.append("allreduce")
        self.work = _Work()
        return self.work


def test_a_python_process_group_is_a_synchronisation_point_and_its_completion_counts():
    timed.watch_process_group_class(_PythonGroup)
    timed.watch_process_group_class(_PythonGroup)  # idempotent
    pg = _PythonGroup()
    clock, ft = _clock()
    pg.allreduce([torch.ones(1)])  # outside a timed thread: only calls through
    with timed.timed(clock):
        clock.charge(2e9, 0)  # 2 s of device work before the collective
        pg.allreduce([torch.ones(1)])
        assert ft.slept == [pytest.approx(2.0)]  # the data is sent when the device has made it
        clock.charge(1e9, 0)  # overlapping work: the device is at 103
        ft.t += 5.0  # the collective completes at 107 (the host waited in Work.wait())
        for cb in pg.work.fut.callbacks:
            cb(pg.work.fut)
        clock.sync()
    assert pg.calls == ["allreduce"] * 2
    assert clock.device_t == pytest.approx(107.0) and clock.stats()["overrun_count"] == 0


def test_a_matrix_file_from_the_environment_sets_the_speeds(tmp_path):
    from hal.core.efficiency import EfficiencyMatrix, MatmulFigure
    m = EfficiencyMatrix(chip="cuda", plugin="p", profile_model=catalog.default("cuda").model, emulated=False,
                         device="cuda:0", ccl="nccl", torch_version="x", host="h", measured_at="t",
                         matmul=[MatmulFigure(dtype="bfloat16", m=8, n=8, k=8, flops_per_s=500e12,
                                              seconds_median=1, repeats=1)])
    m.write(tmp_path / "cuda.json")
    env = {"HAL_EMULATE_TIMED": "1", "HAL_EMULATE_TIME_SCALE": "100", "HAL_EMULATE_TIMED_MATRIX": str(tmp_path)}
    clock = timed.clock_from_env("cuda", catalog.default("cuda"), env)
    assert clock.speeds.flops_per_s == pytest.approx(5e12) and "measured" in clock.speeds.source
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(TimedEmulationError, match="bad.json"):
        timed.clock_from_env("cuda", catalog.default("cuda"), env)
