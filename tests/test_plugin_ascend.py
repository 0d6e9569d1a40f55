"""hal_ascend: probe, native bind, ProcessGroupHCCL with HCCL timeouts, HCCL matrix, fused-op adapters.

No NPU here: the native path runs against the torch_npu stand-in (tests/stand_ins/torch_npu), in a
one-rank WorkerPool because importing it renames torch's PrivateUse1 backend for good. Upstream followed:
- Ascend/pytorch master @ 9e73e708 (torch_npu for torch 2.13-2.15): torch_npu/npu/__init__.py and
  utils.py (device API), torch_npu/_init/registry/backend.py and distributed.py (npu registration,
  `_new_process_group_hccl_helper`), torch_npu/csrc/distributed/ProcessGroupHCCL.cpp and
  HCCLUtils.cpp (reduce ops, dtype checks, HCCL_EXEC_TIMEOUT read once per process),
  torch_npu/distributed/distributed_c10d.py (`_gather` via all_gather);
- Ascend/op-plugin @ 517f2e7d: op_plugin/config/op_plugin_functions.yaml and
  docs/zh/custom_APIs/torch_npu/*.md (npu_rms_norm, npu_fusion_attention, npu_rotary_mul, npu_swiglu);
- CANN env-var reference envref_07_0077 / envref_07_0078 (HCCL_CONNECT_TIMEOUT, HCCL_EXEC_TIMEOUT).
"""
from __future__ import annotations

from datetime import timedelta

import pytest
import torch

import hal
import hal_ascend
import hal_cpu
from hal.testing import WorkerPool

from .stand_ins import ascend_cases as cases


@pytest.fixture(scope="module")
def worker():
    with WorkerPool(1) as pool:
        yield pool


def run(worker, fn, *args):
    return worker.run(fn, *args, timeout=120)[0]


def test_chip_spec():
    c = hal_ascend.CHIP
    assert (c.name, c.torch_device_type, c.ccl_backend, c.ccl_name, c.visible_devices_env) == \
        ("ascend", "npu", "hccl", "HCCL", "ASCEND_RT_VISIBLE_DEVICES")


def test_absent_here_and_native_bind_refused():
    found = hal_ascend.probe()
    assert found["native"] is False and found["reason"] == "torch_npu is not installed"
    pm = hal.PluginManager()
    pm.register(hal_cpu)
    pm.register(hal_ascend)
    with pytest.raises(hal.ChipUnavailableError, match="chip 'ascend'.*not natively available"):
        hal.bind("ascend", emulated=False, pm=pm)  # refused before anything is bound
    with pytest.raises(hal.ChipUnavailableError, match="hook 'hal_device_runtime'.*torch_npu is not installed"):
        hal_ascend.hal_device_runtime("ascend")
    with pytest.raises(hal.ChipUnavailableError, match="ProcessGroupHCCL is unavailable"):
        hal_ascend.hal_create_process_group("ascend", None, 0, 1, timedelta(seconds=5), [0], "g")


def test_adapter_that_fails_to_import_reads_as_absent(tmp_path, monkeypatch):
    pkg = tmp_path / "torch_npu"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('raise RuntimeError("Two accelerators cannot be used at the same time '
                                     'in PyTorch: npu and cuda.")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    found = hal_ascend.probe()
    assert found["native"] is False and "Two accelerators" in found["reason"]


@pytest.mark.parametrize("seconds, soc, exec_s, connect_s", [
    (1, None, 68, 120),         # both floors: 68 s (one HCCL step), 120 s (HCCL_CONNECT_TIMEOUT minimum)
    (600, None, 544, 600),      # 8 x 68 = 544 < 600: HCCL gives up before the watchdog
    (1800, None, 1768, 1800),   # 26 x 68
    (7300, None, 7276, 7200),   # connect capped at 7200 s
    (30000, None, 17340, 7200),  # exec capped at 255 x 68 = 17340 s (training products' maximum)
    (600, 221, 599, 600),       # Atlas A2 (Ascend910B2) takes any whole number of seconds
    (1, 250, 1, 120),           # A3: at least 1 s
])
def test_hccl_timeouts_from_hal_timeout(seconds, soc, exec_s, connect_s):
    env = hal_ascend.hccl_timeout_env(timedelta(seconds=seconds), soc)
    assert env == {"HCCL_EXEC_TIMEOUT": str(exec_s), "HCCL_CONNECT_TIMEOUT": str(connect_s)}
    assert exec_s < seconds or exec_s in (1, 68)  # torch_npu's order: HCCL first, then the watchdog
    if soc is None:
        assert exec_s % 68 == 0


def test_hccl_timeouts_refuse_nonpositive():
    with pytest.raises(ValueError, match="must be positive"):
        hal_ascend.hccl_timeout_env(timedelta(0))


def test_capability_matrix_as_torch_npu_says():
    m = hal_ascend.hccl_capabilities()  # no device selected: the A2 matrix (default 910B2)
    assert not any(e[0] == "gather" for e in m.entries)  # HCCL has no gather: built from all_gather
    assert m.supports("all_gather", "float64") and m.supports("broadcast", "bfloat16")
    assert not m.supports("broadcast", "float8_e4m3fn")  # fp8 data movement: Ascend 950 only
    assert not m.supports("all_reduce", "float64", "sum")  # reductions: no fp64 (Ascend950 only)
    assert m.supports("all_reduce", "bool", "sum") and m.supports("reduce", "uint8", "max")  # cast to int32
    assert not m.supports("reduce_scatter", "bool", "sum")  # reduce_scatter does not cast
    assert m.supports("all_reduce", "bfloat16", "avg") and not m.supports("all_reduce", "int32", "avg")
    assert m.supports("all_reduce", "float16", "premul_sum") and not m.supports("all_reduce", "int8", "premul_sum")
    assert not any(m.supports("all_reduce", "float32", op) for op in ("band", "bor", "bxor"))
    assert m.supports("scatter", "int16") and m.supports("all_to_all_single", "bfloat16")
    assert "ProcessGroupHCCL.cpp" in m.source and "SoC unknown" in m.source


@pytest.mark.parametrize("soc, fp8, bf16_sum, bf16_prod, int16_prod, int16_sum, int64_sum, bf16_move", [
    (221, False, True, False, False, True, True, True),    # Atlas A2 (910B2): no PRODUCT for int16/bf16
    (250, False, True, False, False, True, True, True),    # Atlas A3 (910_9391): as A2
    (102, False, False, False, False, False, True, False),  # Atlas training (910A): no bf16, no int16 reductions
    (260, True, True, False, False, True, False, True),    # Ascend 950: fp8 moves; no int64 reductions in CANN's list
])
def test_capability_matrix_depends_on_the_soc(soc, fp8, bf16_sum, bf16_prod, int16_prod, int16_sum, int64_sum,
                                              bf16_move):
    m = hal_ascend.hccl_capabilities("ascend", soc)
    got = (m.supports("broadcast", "float8_e4m3fn"), m.supports("all_reduce", "bfloat16", "sum"),
           m.supports("all_reduce", "bfloat16", "product"), m.supports("all_reduce", "int16", "product"),
           m.supports("all_reduce", "int16", "sum"), m.supports("all_reduce", "int64", "sum"),
           m.supports("all_gather", "bfloat16"))
    assert got == (fp8, bf16_sum, bf16_prod, int16_prod, int16_sum, int64_sum, bf16_move)
    assert m.supports("all_reduce", "float32", "product") and f"SoC version {soc}" in m.source


def test_native_bind_selects_device_by_local_rank(worker):
    r = run(worker, cases.native_bind, 6, "4,5,6,7", "Ascend910B3")
    assert ("set_device", (2,)) in r["calls"]  # LOCAL_RANK 6 % 4 visible NPUs
    # No context on NPU 0: the device was selected before any torch.npu query (failed before: the
    # device name was read first, and torch_npu's current_device() opened a context on NPU 0).
    assert r["contexts"] == [2], r["first_context"]
    assert "SoC version 223" in r["capabilities_source"]  # read on the selected NPU
    assert r["device"] == "npu:2" and r["emulated"] is False and r["runtime"] == "NpuRuntime"
    assert r["profile"] == hal.core.catalog.get("ascend", "910B3").model  # picked by 'Ascend910B3'
    assert r["memory"] == (60 * 2**30, 64 * 2**30) and r["stream"] == "torch_npu.npu"
    assert r["probe"]["native"] and r["probe"]["device_count"] == 4 and r["probe"]["visible_devices"] == "4,5,6,7"
    k = r["kernels"]
    assert k["rms_norm"] == ("ascend", "torch_npu.npu_rms_norm")
    assert k["scaled_dot_product_attention"] == ("ascend", "torch_npu.npu_fusion_attention")


def test_process_group_hccl_with_timeouts_set_before_creation(worker):
    r = run(worker, cases.process_groups, [600, 1800], {"HCCL_CONNECT_TIMEOUT": "300"})
    (args0, kw0), (args1, kw1) = r["groups"]
    assert args0 == (1, 2) and kw0["timeout_s"] == 600 and kw0["is_high_priority_stream"] is False
    # Set before the group was constructed, HCCL_EXEC_TIMEOUT below the group timeout as torch_npu
    # expects (failed before: 612 >= 600, and ProcessGroupHCCL warned the plog may not be recorded).
    assert kw0["env"] == {"HCCL_EXEC_TIMEOUT": "599", "HCCL_CONNECT_TIMEOUT": "600"}
    assert not any("plog may not be recorded" in m for ws in r["warnings"] for m in ws), r["warnings"]
    assert r["exec_timeout_first_read"] == 599 and kw1["timeout_s"] == 1800
    assert any("HCCL_CONNECT_TIMEOUT=300 (set in the environment) replaced by 600" in m for m in r["warnings"][0])
    # torch_npu keeps the first process-wide value: the second group is told so.
    assert any("keeps it; this group asked for 1799" in m for m in r["warnings"][1])


def test_hccl_timeout_raises_in_the_survivor_and_nobody_is_torn_down(worker):
    """A collective a peer never joins: the bridge's timed wait raises a timeout in the caller within
    the group timeout, and the watchdog does not tear the process down. torch_npu's default error
    handling is TearDown and `WorkHCCL::wait(timeout)` blocks only with TORCH_HCCL_BLOCKING_WAIT=1,
    which the plugin now sets before each group. Failed before (checked against the previous plugin):
    the wait returned at once (nothing raised) and the stand-in's watchdog recorded a teardown."""
    r = run(worker, cases.hccl_timeout)
    assert r["teardowns"] == [], r
    assert r["raised"] is not None and r["raised"]["type"] == "RuntimeError", r
    assert "Watchdog caught collective operation timeout" in r["raised"]["message"]
    assert 0.4 <= r["waited_s"] < 30  # waited for the group timeout, then raised (never a hang)
    assert r["blocking_wait"] == [True, True] and r["async_error_handling"] == [0, 0]
    assert r["env"]["TORCH_HCCL_BLOCKING_WAIT"] == "1"
    # A user's HCCL_BLOCKING_WAIT=0 is replaced, with a warning (TORCH_HCCL_BLOCKING_WAIT wins in torch_npu).
    r = run(worker, cases.hccl_timeout, {"HCCL_BLOCKING_WAIT": "0"}, 0.3)
    assert r["teardowns"] == [] and r["raised"] is not None, r
    assert any("HCCL_BLOCKING_WAIT=0 (set in the environment) replaced by TORCH_HCCL_BLOCKING_WAIT=1" in m
               for m in r["warnings"]), r["warnings"]


def test_hccl_timeout_on_the_training_series_and_too_short(worker):
    r = run(worker, cases.process_groups, [600], {}, "Ascend910A")
    assert r["groups"][0][1]["env"]["HCCL_EXEC_TIMEOUT"] == "544"  # 8 x 68 s < 600 s
    r = run(worker, cases.process_groups, [30], {}, "Ascend910A")
    assert any("too short for HCCL to time out first" in m for m in r["warnings"][0])


def test_process_group_gets_global_ranks_and_group_id(worker):
    """group_id = the group's name (torch_npu hashes it into the HCCL comm id) and
    global_ranks_in_group = its global ranks (empty would make it the global group), as
    _new_process_group_hccl_helper sets them. Failed before: a per-process counter 'hal_hccl_<n>'
    and no global ranks."""
    r = run(worker, cases.process_groups, [600, 600], {}, "Ascend910B2", [3, 5], "hetero/intra/1")
    (_, kw0), (_, kw1) = r["groups"]
    assert (kw0["group_id"], kw1["group_id"]) == ("hetero/intra/1.0", "hetero/intra/1.1")
    assert kw0["global_ranks_in_group"] == [3, 5]


def test_hccl_options_are_fixed_like_pybind(worker):
    assert run(worker, cases.options_reject, "group_name") == "AttributeError: 'Options' object has no attribute 'group_name'"
    assert run(worker, cases.options_reject, "group_id") is None


def test_capabilities_of_the_bound_product(worker):
    a2 = run(worker, cases.capabilities, "Ascend910B3")["declared"]
    assert a2["all_reduce/bfloat16/product"] is False and a2["all_reduce/bfloat16/sum"] is True
    a950 = run(worker, cases.capabilities, "Ascend950")["declared"]
    assert a950["broadcast/float8_e4m3fn/-"] is True and a950["all_reduce/int64/sum"] is False


def test_fused_ops_called_with_vendor_signatures(worker):
    r = run(worker, cases.op_overrides)
    rms = r["rms_norm"]
    assert rms["err"] < 1e-5 and rms["calls"][0][0] == "npu_rms_norm"
    assert rms["calls"][0][2] == {"epsilon": 1e-5}  # (y, rstd) came back; only y is the op's result
    assert r["rms_norm_bf16_f32w"]["calls"] and r["rms_norm_bf16_f32w"]["err"] < 2e-2
    assert r["rms_norm_f64"]["calls"] == [] and r["rms_norm_f64"]["err"] < 1e-12  # outside the docs: reference

    plain = r["sdpa_plain"]["calls"][0]
    assert plain[1][3:] == (4, "BNSD")  # head_num, input_layout
    assert plain[2]["scale"] == pytest.approx(r["scale_default"]) and plain[2]["sparse_mode"] == 0
    assert plain[2]["atten_mask"] is None and plain[2]["keep_prob"] == 1.0
    causal = r["sdpa_causal"]["calls"][0][2]
    assert causal["sparse_mode"] == 2 and causal["atten_mask"] == ("tensor", (2048, 2048), "bool")
    masked = r["sdpa_bool_mask"]
    assert masked["calls"][0][2]["atten_mask"] == ("tensor", (2, 1, 6, 9), "bool")  # B1SS
    assert masked["fa_mask_is_complement"] and masked["dead_row_zero"] and not masked["nan"]
    # A fully masked row asks for the doc's invalid-row computation; a mask without one does not
    # (it costs speed). Failed before: inner_precise was never passed.
    assert masked["calls"][0][2]["inner_precise"] == 2
    assert r["sdpa_live_mask"]["calls"][0][2]["inner_precise"] == 0 and r["sdpa_live_mask"]["err"] < 1e-5
    heads = r["sdpa_head_mask_causal"]
    assert heads["calls"][0][2]["atten_mask"] == ("tensor", (2, 4, 6, 9), "bool")  # 1NSS -> BNSS
    for case in ("sdpa_plain", "sdpa_causal", "sdpa_bool_mask", "sdpa_head_mask_causal"):
        assert r[case]["err"] < 1e-5, (case, r[case]["err"])
    assert r["sdpa_float_mask"]["calls"] == [] and r["sdpa_float_mask"]["err"] < 1e-6

    rot = r["rotary"]["calls"][0]
    assert rot[0] == "npu_rotary_mul" and rot[2]["rotary_mode"] == "half" and r["rotary"]["err"] < 1e-5
    assert r["rotary_2d_cos"]["calls"] == []  # 2-D cos is outside the documented layouts: reference
    sw = r["swiglu"]["calls"][0]
    assert sw[0] == "npu_swiglu" and sw[2] == {"dim": -1} and r["swiglu"]["err"] < 1e-5


def test_ascend_kernels_pass_the_golden(worker):
    # The HAL's golden cases (odd sizes, strided views, every mask kind, fully masked rows, ...)
    # through every override, the vendor ops being the stand-in's documented math.
    r = run(worker, cases.golden_failures, ["float32", "float16", "bfloat16", "float64"])
    assert {"rms_norm", "scaled_dot_product_attention", "rotary_embedding", "swiglu", "adamw_step"} <= set(r["ops"])
    assert r["vendor_calls"] == ["npu_fusion_attention", "npu_rms_norm", "npu_rotary_mul", "npu_swiglu"]
    assert not r["failures"], "\n".join(r["failures"])


@pytest.mark.parametrize("name, fused", [
    ("Ascend910B2", {"rms_norm", "scaled_dot_product_attention", "rotary_embedding", "swiglu", "adamw_step"}),
    ("Ascend910_9391", {"rms_norm", "rotary_embedding", "adamw_step"}),   # A3: FA and swiglu docs list A2 only
    ("Ascend910A", {"rms_norm"}),                           # Atlas training: rms_norm only, no aclnnApplyAdamWV2
    ("Ascend950", {"rms_norm", "scaled_dot_product_attention"}),  # no aclnnApplyAdamWV2 listed for 950
])
def test_fused_kernels_only_where_documented(worker, name, fused):
    got = run(worker, cases.family_kernels, name)
    assert {op for op, label in got.items() if "npu" in label or "aclnn" in label} == fused


def test_fused_adamw_only_for_the_dtypes_aclnn_takes():
    from hal.ops import reference
    from hal_ascend import kernels
    assert kernels.make_adamw("training") is None and kernels.make_adamw("950") is None
    calls = []
    step = kernels.make_adamw("A2", fused=lambda *a: calls.append(a[0][0].dtype))
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        p = [torch.ones(3, dtype=dtype)]
        g, m, v = [torch.full((3,), 0.5, dtype=dtype)], [torch.zeros(3, dtype=dtype)], [torch.zeros(3, dtype=dtype)]
        step(p, g, m, v, 1, 1e-2, 0.9, 0.999, 1e-8, 0.0)
    assert calls == [torch.float32, torch.bfloat16, torch.float16]  # float64 took the reference
    p, ref_p = [torch.ones(3)], [torch.ones(3)]
    mixed = ([torch.full((3,), 0.5, dtype=torch.bfloat16)], [torch.zeros(3)], [torch.zeros(3)])
    step(p, *mixed, 1, 1e-2, 0.9, 0.999, 1e-8, 0.0)
    reference.adamw_step(ref_p, [mixed[0][0].clone()], [torch.zeros(3)], [torch.zeros(3)], 1, 1e-2, 0.9, 0.999, 1e-8, 0.0)
    assert len(calls) == 3 and torch.equal(p[0], ref_p[0])  # mixed dtypes: the reference


def test_no_ascend_kernels_when_emulated():
    pm = hal.PluginManager()
    pm.register(hal_cpu)
    pm.register(hal_ascend)
    assert not [k for k in pm.op_kernels("ascend", emulated=True) if k.plugin == "ascend"]
