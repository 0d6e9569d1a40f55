"""hal_cuda: probe, native bind, ProcessGroupNCCL creation, NCCL capability matrix, op overrides.

Natively unavailable here, so the native path runs against torch.cuda patched to show NVIDIA GPUs
and a stand-in ProcessGroupNCCL (tests/stand_ins/_stand_in_cuda.py, _stand_in_nccl.py). Upstream followed:
- pytorch/pytorch v2.13.0, torch/distributed/distributed_c10d.py `_new_process_group_helper`
  (the copy installed here): ProcessGroupNCCL.Options(), is_high_priority_stream = False,
  _timeout = timeout, ProcessGroupNCCL(store, rank, size, options), _set_sequence_number_for_group().
- pytorch/pytorch main as indexed: torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (ncclOp,
  getNcclReduceOp, isUnsupportedFloat8) and NCCLUtils.hpp (ncclDataType, NCCL_SUPPORTS_FP8 >= 2.24).
Tests marked `cuda` run the same paths on a real NVIDIA GPU and are skipped elsewhere.
"""
from __future__ import annotations

import importlib
import warnings
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import hal
import hal_cpu
import hal_cuda
import hal_kunlun
from hal.ops import golden, reference
from hal.ops import torch_kernels as kernels  # the kernels hal_cuda offers (sdk.torch_kernels)

from .stand_ins import _stand_in_nccl as fake_nccl
from .stand_ins._stand_in_cuda import CudaState, patch_torch_cuda

_acc_module = importlib.import_module("hal.core.selection")
HAS_GPU = torch.cuda.is_available()


@pytest.fixture
def restore_hal():
    pm = _acc_module.get_plugin_manager()
    prev = hal.bound()
    yield
    hal.set_plugin_manager(pm)
    hal.reset()
    if prev is not None:
        _acc_module._BOUND = prev
        hal.ops.bind(prev.kernels)


@pytest.fixture
def pm(restore_hal):
    m = hal.PluginManager()
    for plugin in (hal_cpu, hal_cuda, hal_kunlun):
        m.register(plugin)
    return m


@pytest.fixture
def fake_nvidia(monkeypatch):
    """torch.cuda patched to show two NVIDIA H100s; calls recorded in `.calls`."""
    return patch_torch_cuda(monkeypatch, CudaState())


def test_chip_spec():
    c = hal_cuda.CHIP
    assert (c.name, c.torch_device_type, c.ccl_backend, c.ccl_name, c.visible_devices_env) == \
        ("cuda", "cuda", "nccl", "NCCL", "CUDA_VISIBLE_DEVICES")


@pytest.mark.skipif(HAS_GPU, reason="an NVIDIA GPU is present: the native tests below cover it")
def test_absent_here_and_native_bind_refused(pm):
    found = hal_cuda.probe()
    why = "without CUDA" if torch.version.cuda is None else "no CUDA device visible"  # CPU or CUDA build of torch
    assert found["native"] is False and why in found["reason"]
    assert pm.native_available("cuda") is False
    with pytest.raises(hal.ChipUnavailableError, match="chip 'cuda'.*not natively available"):
        hal.bind("cuda", emulated=False, pm=pm)
    with pytest.raises(hal.ChipUnavailableError, match="hook 'hal_device_runtime'"):
        hal_cuda.hal_device_runtime("cuda")


def test_other_cuda_builds_not_claimed(fake_nvidia, monkeypatch):
    monkeypatch.setattr(torch.version, "hip", "6.2")
    found = hal_cuda.probe()
    assert found["native"] is False and "ROCm" in found["reason"]
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert hal_cuda.probe()["native"] is False


def test_native_bind_device_by_local_rank(pm, fake_nvidia, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")  # applied by the CUDA runtime; the probe reports it
    assert hal_cuda.probe()["visible_devices"] == "4,6"
    acc = hal.bind("cuda", emulated=False, pm=pm)
    assert ("set_device", 1) in fake_nvidia.calls  # LOCAL_RANK 3 % 2 devices
    assert acc.device == torch.device("cuda", 1) and not acc.emulated
    assert isinstance(acc.runtime, hal_cuda.CudaRuntime) and acc.runtime.module is torch.cuda
    assert acc.profile.model == hal.core.catalog.get("cuda", "H100").model  # picked by device name
    assert acc.get_memory_info() == (3 * 2**30, 80 * 2**30)
    assert acc.Stream is torch.cuda.Stream and acc.Event is torch.cuda.Event
    assert acc.kernels["scaled_dot_product_attention"].plugin == "cuda"
    assert acc.kernels["adamw_step"].name == "torch.optim.adamw(fused=True)"
    # The fp8 reductions NCCL >= 2.24 does on SM 9.0 are declared once the device is known.
    assert acc.capabilities.supports("all_reduce", "float8_e4m3fn", "sum")


def test_unknown_gpu_gets_a_profile_of_unknowns(pm, fake_nvidia):
    fake_nvidia.name = "NVIDIA GeForce RTX 4090"
    acc = hal.bind("cuda", emulated=False, pm=pm)
    prof = acc.profile
    assert prof.model == "NVIDIA GeForce RTX 4090" and "measured later" in prof.notes
    figures = list(prof.peak_flops.values()) + [prof.memory_bytes, prof.memory_bandwidth,
                                                prof.intra_node_bandwidth, prof.nic_bandwidth]
    assert figures and all(f.value is None for f in figures)


def test_process_group_is_nccl_with_hal_timeout(pm, fake_nvidia):
    acc = hal.bind("cuda", emulated=False, pm=pm)
    store = dist.HashStore()
    pg = acc.new_process_group(store, 1, 4, timedelta(seconds=42), global_ranks=[0, 2, 5, 7], group_name="g3")
    assert isinstance(pg, fake_nccl.FakeProcessGroupNCCL)
    rec = fake_nccl.CREATED[-1]
    assert rec["store"] is store and (rec["rank"], rec["size"]) == (1, 4)
    assert rec["timeout"] == timedelta(seconds=42) and rec["is_high_priority_stream"] is False
    assert rec["seq_set"] is True
    # The plugin manager wraps the ValueError, naming plugin and hook.
    with pytest.raises(hal.PluginHookError, match="plugin 'cuda', hook 'hal_create_process_group'.*timeout must be a positive"):
        acc.new_process_group(store, 0, 2, timedelta(0), group_name="g")
    with pytest.raises(hal.PluginHookError, match=r"rank 5 is not in \[0, world_size=2\)"):
        acc.new_process_group(store, 5, 2, timedelta(seconds=1), group_name="g")


def test_process_group_gets_global_ranks_and_group_name(pm, fake_nvidia):
    """As _new_process_group_helper (torch 2.13) fills ProcessGroupNCCL.Options: global_ranks_in_group
    and group_name, the same on every member (failed before contract 1.1: neither reached NCCL)."""
    acc = hal.bind("cuda", emulated=False, pm=pm)
    acc.new_process_group(dist.HashStore(), 1, 3, timedelta(seconds=42), global_ranks=[4, 6, 7],
                          group_name="hetero/intra/1")
    rec = fake_nccl.CREATED[-1]
    assert rec["global_ranks_in_group"] == [4, 6, 7] and rec["group_name"] == "hetero/intra/1"
    # Without them (a caller that does not know), both are agreed through the group's store: every
    # member gets the same name and the members' global ranks (RANK; the group rank without it).
    import threading
    store, results = dist.HashStore(), {}

    def member(r):
        acc.new_process_group(store, r, 2, timedelta(seconds=20))
        results[r] = next(c for c in reversed(fake_nccl.CREATED) if c["rank"] == r)
    for _ in range(2):  # two groups on one store: two names
        threads = [threading.Thread(target=member, args=(r,)) for r in (0, 1)]
        [th.start() for th in threads]
        [th.join(60) for th in threads]
        assert results[0]["group_name"] == results[1]["group_name"] and results[0]["group_name"].startswith("hal-")
        assert results[0]["global_ranks_in_group"] == results[1]["global_ranks_in_group"] == [0, 1]
        names = results.setdefault("names", set())
        names.add(results[0]["group_name"])
    assert len(results["names"]) == 2
    with pytest.raises(ValueError, match=r"global_ranks=\[3, 3\] must be 2 distinct"):
        acc.new_process_group(dist.HashStore(), 0, 2, timedelta(seconds=5), global_ranks=[3, 3], group_name="x")


def test_nccl_options_are_fixed_like_pybind():
    opts = fake_nccl.FakeProcessGroupNCCL.Options()
    opts.group_name = "g"
    with pytest.raises(AttributeError, match="has no attribute 'group_id'"):
        opts.group_id = "g"  # HCCL's field name, not NCCL's
    with pytest.raises(AttributeError):
        opts.backend = "gloo"


def test_nccl_timeout_reaches_the_bridge_as_a_catchable_error(pm, fake_nvidia, monkeypatch):
    """A collective a peer never joins: the bridge's wait raises StageFailure within the group
    timeout, and the process is not torn down (TORCH_NCCL_ASYNC_ERROR_HANDLING=2, CleanUpOnly).
    Before: the variable was left at torch's default 3 (the watchdog kills the process) and the
    bridge's wait returned at once on an unfinished NCCL work."""
    import time

    from hal.ccl_bridge.ccl import Ccl, StageFailure
    acc = hal.bind("cuda", emulated=False, pm=pm)
    store, t = dist.HashStore(), timedelta(seconds=0.5)
    pgs = [acc.new_process_group(store, r, 2, t, global_ranks=[0, 1], group_name="g") for r in (0, 1)]
    assert all(pg.async_error_handling == 2 for pg in pgs)
    ccl = Ccl(pgs[0], acc.capabilities, "cuda sub-cluster CCL (ranks [0, 1])", 0, 2, torch.device("cuda", 0), t)
    x = torch.ones(8)
    h = ccl.all_reduce(x, "sum")  # rank 1 never calls
    t0 = time.monotonic()
    with pytest.raises(StageFailure, match="all_reduce float32 sum on cuda sub-cluster CCL.*timing out"):
        h.wait()
    assert time.monotonic() - t0 < 30  # bounded (never a hang); no figure is asserted
    time.sleep(0.7)  # past the watchdog's timeout too
    assert fake_nccl.TEARDOWNS == []
    # A user who chose a teardown mode is told what it costs.
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    with pytest.warns(RuntimeWarning, match="TORCH_NCCL_ASYNC_ERROR_HANDLING=3.*tears the process down"):
        acc.new_process_group(store, 0, 2, t, global_ranks=[0, 1], group_name="g2")


def _fast_monitor(monkeypatch):
    """torch's own monitor settings, made short (the HAL leaves these alone)."""
    monkeypatch.setenv("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "1")
    monkeypatch.setenv("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", "10")
    monkeypatch.setenv("TORCH_NCCL_COORD_CHECK_MILSEC", "20")


def _time_out_one_collective(acc, store, name):
    """Ranks 0 and 1 of group `name`; rank 0 all-reduces through the bridge's Ccl, rank 1 never
    joins. Returns rank 0's error (the survivor's) and both groups."""
    from hal.ccl_bridge.ccl import Ccl, StageFailure
    t = timedelta(seconds=0.3)
    pgs = [acc.new_process_group(store, r, 2, t, global_ranks=[0, 1], group_name=name) for r in (0, 1)]
    ccl = Ccl(pgs[0], acc.capabilities, f"cuda sub-cluster CCL of {name}", 0, 2, torch.device("cuda", 0), t)
    with pytest.raises(StageFailure, match="timing out") as err:
        ccl.all_reduce(torch.ones(4), "sum").wait()
    return err.value, pgs


def test_nccl_timeout_survivor_raises_and_lives(pm, fake_nvidia, monkeypatch):
    """After a timeout the rank that raised keeps living. torch's watchdog broadcasts a dump signal
    (store key + shouldDump_) on every timeout; the heartbeat monitor of each rank's first NCCL group
    (uid 0), with TORCH_NCCL_DUMP_ON_TIMEOUT on (torch's default), then terminates the process
    TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC later unless that group was aborted. The plugin sets
    TORCH_NCCL_DUMP_ON_TIMEOUT=0 before the first group. Failed before (checked against the previous
    plugin): the survivor raised, then the stand-in's uid-0 monitor recorded a teardown."""
    import time
    _fast_monitor(monkeypatch)
    acc = hal.bind("cuda", emulated=False, pm=pm)
    err, pgs = _time_out_one_collective(acc, dist.HashStore(), "g")
    assert "timing out" in str(err.cause)
    time.sleep(2.0)  # watchdog (0.3 s) + dump wait + the monitor's 1 s heartbeat sleep, with margin
    assert fake_nccl.TEARDOWNS == []
    assert pgs[0].uid == 0 and pgs[0].dump_on_timeout is False and pgs[0].monitoring is True
    # A user who turns dump-on-timeout on is told what it costs.
    monkeypatch.setenv("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    with pytest.warns(RuntimeWarning, match="TORCH_NCCL_DUMP_ON_TIMEOUT=1.*terminates that process"):
        acc.new_process_group(dist.HashStore(), 0, 2, timedelta(seconds=5), global_ranks=[0, 1], group_name="g2")


def _hetero(name, inner, device):
    """A HeteroProcessGroup over a stand-in fabric: only what breaking and aborting read."""
    from types import SimpleNamespace

    from hal.ccl_bridge.process_group import HeteroProcessGroup
    fabric = SimpleNamespace(rank=0, world=2, timeout=timedelta(seconds=5), inner_groups=list(inner),
                             intra=SimpleNamespace(device=device), sync=SimpleNamespace(bind_thread=lambda: None))
    pg = HeteroProcessGroup(fabric)
    pg.setGroupName(name)
    return pg


class _RefusesAbort:
    def abort(self):
        raise RuntimeError("abort not supported")


def test_a_failed_bridge_aborts_every_group_and_the_first_nccl_group_survives(pm, fake_nvidia, monkeypatch):
    """A user who keeps TORCH_NCCL_DUMP_ON_TIMEOUT=1: only aborting the process's first NCCL group
    (uid 0) stops its monitor. Group A's device CCL holds it; group B's device CCL times out. The
    bridge breaks every hetero group of the process when a device CCL fails, aborting every inner
    group (one that refuses is recorded, the rest still aborted). Failed before: only B's inner groups
    were aborted and the uid-0 monitor terminated the process."""
    import time

    from hal.ccl_bridge.errors import BridgePeerError, BridgeTimeoutError
    _fast_monitor(monkeypatch)
    monkeypatch.setenv("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    acc = hal.bind("cuda", emulated=False, pm=pm)
    store = dist.HashStore()
    cuda0 = torch.device("cuda", 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the plugin warns about the user's choice (above)
        first = [acc.new_process_group(store, r, 2, timedelta(seconds=30), global_ranks=[0, 1], group_name="a")
                 for r in (0, 1)]
        group_a = _hetero("A", [first[0]], cuda0)
        err, pgs_b = _time_out_one_collective(acc, store, "b")
    refuses = _RefusesAbort()
    group_b = _hetero("B", [refuses, pgs_b[0]], cuda0)
    typed = group_b._on_error("all_reduce", 1, time.monotonic())(err)  # the executor's path for a failed job
    time.sleep(2.0)
    assert fake_nccl.TEARDOWNS == []
    assert first[0].uid == 0 and first[0].dump_on_timeout
    assert isinstance(typed, BridgeTimeoutError)
    assert pgs_b[0].stopped and first[0].stopped  # every group of the failed bridge was aborted
    assert group_b.abort_errors and "abort not supported" in group_b.abort_errors[0]
    with pytest.raises(BridgePeerError, match="group 'A'.*device CCL of group 'B' failed"):
        group_a._check_usable("all_reduce")
    # Emulated chips' host fabrics: a failure leaves the other groups alone.
    host_c, host_d = _hetero("C", [], torch.device("cpu")), _hetero("D", [], torch.device("cpu"))
    host_d._break(BridgePeerError("peer died", group="D"))
    host_c._check_usable("all_reduce")
    for g in (group_a, group_b, host_c, host_d):
        g.shutdown()


def test_probe_is_fork_safe(fake_nvidia):
    """The availability probe counts GPUs through NVML (torch.cuda.device_count before CUDA is
    initialised) and never calls is_available(), whose cudaGetDeviceCount runs cuInit and breaks
    every later fork() (the bridge and torch's DataLoader fork). Failed before: is_available()."""
    found = hal_cuda.probe()
    assert found["native"] is True and found["device_count"] == 2
    assert fake_nvidia.fork_poisoned_by == [], fake_nvidia.fork_poisoned_by


def test_probe_uses_public_torch_cuda_api_only(fake_nvidia):
    """torch.cuda.device_count() is public; torch.cuda._device_count_nvml is not (failed before: the
    probe called it to guess whether NVML answered; no public API says, and the probe says so)."""
    found = hal_cuda.probe()
    assert not [c for c in fake_nvidia.calls if "private" in c[0]], fake_nvidia.calls
    assert "fork_safe" not in found and "no public API" in found["count_source"]


def test_native_bind_selects_the_device_before_asking_anything(pm, fake_nvidia, monkeypatch):
    """set_device(LOCAL_RANK % n) comes before the device name or capability queries; asking first
    opens a context on device 0 in every rank (failed before: current_device() came first)."""
    monkeypatch.setenv("LOCAL_RANK", "1")
    hal.bind("cuda", emulated=False, pm=pm)
    first = next(c for c in fake_nvidia.calls if c[0] != "is_available")
    assert first == ("set_device", 1), fake_nvidia.calls


def test_process_group_without_nccl_build(monkeypatch):
    monkeypatch.delattr(dist, "ProcessGroupNCCL", raising=False)
    monkeypatch.delattr(dist.distributed_c10d, "ProcessGroupNCCL", raising=False)  # a CUDA build (the 2.5 lane)
    with pytest.raises(hal.ChipUnavailableError, match="no NCCL"):
        hal_cuda.hal_create_process_group("cuda", dist.HashStore(), 0, 1, timedelta(seconds=5), [0], "g")


def test_capability_matrix_as_torch_source_says():
    m = hal_cuda.nccl_capabilities()
    assert m.supports("all_reduce", "bfloat16", "avg") and m.supports("reduce_scatter", "float16", "premul_sum")
    assert m.supports("all_reduce", "bool", "sum") and not m.supports("all_reduce", "bool", "avg")
    assert not m.supports("all_reduce", "int32", "premul_sum") and m.supports("all_reduce", "int32", "avg")
    assert not any(m.supports("all_reduce", "float32", op) for op in ("band", "bor", "bxor"))
    assert not any(e[1] == "int16" for e in m.entries)  # not in ncclDataType
    assert m.supports("gather", "float32") and m.supports("all_to_all", "int64")
    assert m.supports("all_gather", "float8_e5m2") and not m.supports("all_reduce", "float8_e5m2", "sum")
    fp8 = hal_cuda.nccl_capabilities(nccl_version=(2, 27, 3), compute_capability=(9, 0))
    assert fp8.supports("all_reduce", "float8_e4m3fn", "max") and not fp8.supports("all_reduce", "float8_e4m3fn", "premul_sum")
    assert not hal_cuda.nccl_capabilities(nccl_version=(2, 27, 3), compute_capability=(8, 0)).supports(
        "all_reduce", "float8_e4m3fn", "sum")
    old = hal_cuda.nccl_capabilities(nccl_version=(2, 9, 9), compute_capability=(8, 0))
    assert not old.supports("all_reduce", "float32", "avg") and not old.supports("all_reduce", "float32", "premul_sum")
    assert "ProcessGroupNCCL.cpp" in m.source


def test_no_cuda_kernels_when_emulated(pm):
    assert not [k for k in pm.op_kernels("cuda", emulated=True) if k.plugin == "cuda"]
    assert {k.op for k in pm.op_kernels("cuda", emulated=False) if k.plugin == "cuda"} >= {
        "scaled_dot_product_attention", "adamw_step", "rms_norm"}


def _sdpa_cases(device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 5, 16, generator=g).to(device, dtype)
    k = torch.randn(2, 3, 7, 16, generator=g).to(device, dtype)
    v = torch.randn(2, 3, 7, 16, generator=g).to(device, dtype)
    bool_mask = torch.rand(2, 1, 5, 7, generator=g) > 0.4
    bool_mask[0, 0, 2] = False  # a row with no key: the HAL gives zeros
    add_mask = torch.randn(5, 7, generator=g)
    add_mask[1] = float("-inf")
    for mask in (None, bool_mask.to(device), add_mask.to(device, dtype)):
        for causal in (False, True):
            yield q, k, v, mask, causal


def test_cuda_kernels_match_reference_on_cpu_tensors():
    for q, k, v, mask, causal in _sdpa_cases():
        got = kernels.scaled_dot_product_attention(q, k, v, mask, causal, 0.3)
        want = reference.scaled_dot_product_attention(q, k, v, mask, causal, 0.3)
        assert torch.allclose(got, want, atol=1e-5), (mask is None, causal, (got - want).abs().max())
    g = torch.Generator().manual_seed(1)
    params = [torch.randn(4, 3, generator=g), torch.randn(5, generator=g)]
    grads = [torch.randn_like(p) for p in params]
    a = [p.clone() for p in params]
    b = [p.clone() for p in params]
    sa = [[torch.zeros_like(p) for p in params] for _ in range(2)]
    sb = [[torch.zeros_like(p) for p in params] for _ in range(2)]
    for step in (1, 2, 3):
        kernels.adamw_step(a, grads, sa[0], sa[1], step, 1e-2, 0.9, 0.999, 1e-8, 0.1)
        reference.adamw_step(b, grads, sb[0], sb[1], step, 1e-2, 0.9, 0.999, 1e-8, 0.1)
    assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(a, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64], ids=str)
def test_cuda_kernels_pass_the_golden_on_cpu_tensors(dtype):
    # The HAL's golden cases (odd sizes, strided views, every mask kind, fully masked rows...) run
    # through each kernel this plugin offers; the kernels are plain torch, so CPU tensors exercise them.
    failures = [r.describe() for op, (fn, label) in kernels.KERNELS.items()
                for r in golden.check_op(fn, op, dtype, label) if not r.ok]
    assert not failures, "\n".join(failures)


# ---- on a real NVIDIA GPU (skipped elsewhere) ---------------------------------------------------
@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="needs a native NVIDIA GPU")
def test_native_gpu_bind_kernels_and_nccl(restore_hal):
    pm = hal.PluginManager()
    for plugin in (hal_cpu, hal_cuda):
        pm.register(plugin)
    acc = hal.bind("cuda", emulated=False, pm=pm)
    print(f"\n[cuda] device {acc.device} '{acc.runtime.device_name()}' profile {acc.profile.model!r}; "
          f"capabilities: {acc.capabilities.source}")
    for dtype, atol in ((torch.float32, 2e-3), (torch.bfloat16, 3e-2)):
        for q, k, v, mask, causal in _sdpa_cases("cuda", dtype):
            got = hal.ops.scaled_dot_product_attention(q, k, v, mask, causal)
            want = reference.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                          None if mask is None else mask.float() if mask.dtype != torch.bool else mask,
                                                          causal)
            err = (got.float() - want).abs().max().item()
            assert err < atol, (dtype, mask is None, causal, err)
    t = torch.full((1024,), 2.0, device=acc.device)
    pg = acc.new_process_group(dist.HashStore(), 0, 1, timedelta(seconds=60))
    pg.allreduce([t]).wait()
    torch.cuda.synchronize()
    print(f"[cuda] ProcessGroupNCCL world 1 all_reduce -> {t[0].item()} ({pg.name()})")
    assert t[0].item() == 2.0


def test_bridge_ccl_moves_int16_bytes_over_nccl_from_strided_views(pm, fake_nvidia):
    """int16 is not an NCCL dtype: the bridge moves its bytes as uint8 (route `bits:uint8`), also for
    strided views (a byte view needs unit stride: the bytes go through a copy)."""
    import threading

    from hal.ccl_bridge.ccl import Ccl
    acc = hal.bind("cuda", emulated=False, pm=pm)
    store, t = dist.HashStore(), timedelta(seconds=20)
    pgs = [acc.new_process_group(store, r, 2, t, global_ranks=[0, 1], group_name="bits") for r in (0, 1)]
    got, errors = {}, []

    def rank(r):
        try:
            ccl = Ccl(pgs[r], acc.capabilities, "cuda CCL", r, 2, torch.device("cuda", 0), t)
            inp = (torch.arange(16, dtype=torch.int16) + 100 * r)[::2]  # 8 elements, stride 2
            out = torch.zeros(16, dtype=torch.int16)[::2]
            assert ccl.route("all_to_all_single", torch.int16) == "bits:uint8"
            ccl.all_to_all_single(out, inp, [4, 4], [4, 4]).wait()
            got[r] = out.tolist()
        except Exception as exc:  # reported below with the rank
            errors.append(f"rank {r}: {type(exc).__name__}: {exc}")
    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    [th.start() for th in threads]
    [th.join(60) for th in threads]
    assert not errors, errors
    assert got == {0: [0, 2, 4, 6, 100, 102, 104, 106], 1: [8, 10, 12, 14, 108, 110, 112, 114]}
