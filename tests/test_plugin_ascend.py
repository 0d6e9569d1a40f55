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
        hal_ascend.hal_create_process_group("ascend", None, 0, 1, timedelta(seconds=5))


def test_adapter_that_fails_to_import_reads_as_absent(tmp_path, monkeypatch):
    pkg = tmp_path / "torch_npu"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('raise RuntimeError("Two accelerators cannot be used at the same time '
                                     'in PyTorch: npu and cuda.")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    found = hal_ascend.probe()
    assert found["native"] is False and "Two accelerators" in found["reason"]


@pytest.mark.parametrize("seconds, exec_s, connect_s", [
    (1, 68, 120),        # both floors: 68 s (one HCCL step), 120 s (HCCL_CONNECT_TIMEOUT minimum)
    (600, 612, 600),     # ceil(600 / 68) = 9 steps = 612 s
    (1800, 1836, 1800),  # 27 x 68 = 1836 s, HCCL's own default
    (7300, 7344, 7200),  # connect capped at 7200 s
    (30000, 17340, 7200),  # exec capped at 255 x 68 = 17340 s
])
def test_hccl_timeouts_from_hal_timeout(seconds, exec_s, connect_s):
    env = hal_ascend.hccl_timeout_env(timedelta(seconds=seconds))
    assert env == {"HCCL_EXEC_TIMEOUT": str(exec_s), "HCCL_CONNECT_TIMEOUT": str(connect_s)}
    assert exec_s % 68 == 0 and (exec_s >= seconds or exec_s == 17340)


def test_hccl_timeouts_refuse_nonpositive():
    with pytest.raises(ValueError, match="must be positive"):
        hal_ascend.hccl_timeout_env(timedelta(0))


def test_capability_matrix_as_torch_npu_says():
    m = hal_ascend.hccl_capabilities()
    assert not any(e[0] == "gather" for e in m.entries)  # HCCL has no gather: built from all_gather
    assert m.supports("all_gather", "float64") and m.supports("broadcast", "float8_e4m3fn")
    assert not m.supports("all_reduce", "float64", "sum")  # reductions: no fp64 (Ascend950 only)
    assert m.supports("all_reduce", "bool", "sum") and m.supports("reduce", "uint8", "max")  # cast to int32
    assert not m.supports("reduce_scatter", "bool", "sum")  # reduce_scatter does not cast
    assert m.supports("all_reduce", "bfloat16", "avg") and not m.supports("all_reduce", "int32", "avg")
    assert m.supports("all_reduce", "float16", "premul_sum") and not m.supports("all_reduce", "int8", "premul_sum")
    assert not any(m.supports("all_reduce", "float32", op) for op in ("band", "bor", "bxor"))
    assert m.supports("scatter", "int16") and m.supports("all_to_all_single", "bfloat16")
    assert "ProcessGroupHCCL.cpp" in m.source


def test_native_bind_selects_device_by_local_rank(worker):
    r = run(worker, cases.native_bind, 6, "4,5,6,7", "Ascend910B3")
    assert ("set_device", (2,)) in r["calls"]  # LOCAL_RANK 6 % 4 visible NPUs
    assert r["device"] == "npu:2" and r["emulated"] is False and r["runtime"] == "NpuRuntime"
    assert r["profile"] == hal.catalog.get("ascend", "910B3").model  # picked by 'Ascend910B3'
    assert r["memory"] == (60 * 2**30, 64 * 2**30) and r["stream"] == "torch_npu.npu"
    assert r["probe"]["native"] and r["probe"]["device_count"] == 4 and r["probe"]["visible_devices"] == "4,5,6,7"
    k = r["kernels"]
    assert k["rms_norm"] == ("ascend", "torch_npu.npu_rms_norm")
    assert k["scaled_dot_product_attention"] == ("ascend", "torch_npu.npu_fusion_attention")


def test_process_group_hccl_with_timeouts_set_before_creation(worker):
    r = run(worker, cases.process_groups, [600, 1800], {"HCCL_CONNECT_TIMEOUT": "300"})
    (args0, kw0), (args1, kw1) = r["groups"]
    assert args0 == (1, 2) and kw0["timeout_s"] == 600 and kw0["is_high_priority_stream"] is False
    # The variables were already set when the group was constructed (HCCL reads them then).
    assert kw0["env"] == {"HCCL_EXEC_TIMEOUT": "612", "HCCL_CONNECT_TIMEOUT": "600"}
    assert kw0["group_id"] != kw1["group_id"] and kw1["timeout_s"] == 1800
    assert any("HCCL_CONNECT_TIMEOUT=300 (set in the environment) replaced by 600" in m for m in r["warnings"][0])
    # torch_npu keeps the first process-wide value: the second group is told so.
    assert any("keeps it; this group asked for 1836" in m for m in r["warnings"][1])


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
    ("Ascend910B2", {"rms_norm", "scaled_dot_product_attention", "rotary_embedding", "swiglu"}),
    ("Ascend910_9391", {"rms_norm", "rotary_embedding"}),   # A3: FA and swiglu docs list A2 only
    ("Ascend910A", {"rms_norm"}),                           # Atlas training: rms_norm only
])
def test_fused_kernels_only_where_documented(worker, name, fused):
    got = run(worker, cases.family_kernels, name)
    assert {op for op, label in got.items() if label.startswith("torch_npu.")} == fused


def test_no_ascend_kernels_when_emulated():
    pm = hal.PluginManager()
    pm.register(hal_cpu)
    pm.register(hal_ascend)
    assert not [k for k in pm.op_kernels("ascend", emulated=True) if k.plugin == "ascend"]
