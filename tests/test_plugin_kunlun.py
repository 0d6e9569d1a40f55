"""hal_kunlun: telling a Kunlun machine from an NVIDIA one, native bind, XCCL group, matrix, kernels.

No Kunlun hardware here: a stand-in torch_xmlir (tests/stand_ins/torch_xmlir) and torch.cuda patched
to show devices (tests/stand_ins/_stand_in_cuda.py). Upstream followed:
- baidu-baige/sglang-kunlun, sglang_kunlun/platform/srt.py `activate()` (Kunlun = torch_xmlir
  importable) and sglang_kunlun/platform/device.py (device_type "cuda"), as indexed (file commit
  0cf4bafc / 29c85e96);
- baidu/vLLM-Kunlun @ 09869ee7: vllm_kunlun/platforms/kunlun.py (device_type "cuda",
  dist_backend "nccl"), vllm_kunlun/distributed/kunlun_communicator.py (collectives used),
  docs/source/user_guide/configuration/env_vars.md (XPU_VISIBLE_DEVICES);
- pytorch/pytorch v2.13.0 torch/distributed/distributed_c10d.py for the `nccl` group construction.
"""
from __future__ import annotations

import importlib
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import hal
import hal_cpu
import hal_cuda
import hal_kunlun
from hal.ops import golden

from . import stand_ins
from .stand_ins import _stand_in_nccl as fake_nccl
from .stand_ins._stand_in_cuda import CudaState, patch_torch_cuda

_acc_module = importlib.import_module("hal.accelerator")


@pytest.fixture
def pm():
    prev_pm, prev = _acc_module.get_plugin_manager(), hal.bound()
    m = hal.PluginManager()
    for plugin in (hal_cpu, hal_cuda, hal_kunlun):
        m.register(plugin)
    yield m
    hal.set_plugin_manager(prev_pm)
    hal.reset()
    if prev is not None:
        _acc_module._BOUND = prev
        hal.ops.bind(prev.kernels)
    hal_kunlun.LAST_PROBE = None


@pytest.fixture
def xmlir():
    """The stand-in torch_xmlir on sys.path (a KunlunXin PyTorch build), two 'P800' XPUs."""
    stand_ins.activate()
    xpu = importlib.import_module("torch_xmlir.xpu")
    xpu.NAMES[:] = ["P800", "P800"]
    xpu.CALLS.clear()
    yield xpu
    stand_ins.deactivate()


@pytest.fixture
def devices(monkeypatch):
    """torch.cuda sees two devices; through the Kunlun build's CUDA shim they may call themselves 'GPU'."""
    return patch_torch_cuda(monkeypatch, CudaState(count=2, name="GPU", capability=(8, 6)))


def test_chip_spec():
    c = hal_kunlun.CHIP
    assert (c.name, c.torch_device_type, c.ccl_backend, c.ccl_name, c.visible_devices_env) == \
        ("kunlun", "cuda", "nccl", "XCCL", "XPU_VISIBLE_DEVICES")


def test_absent_here_and_native_bind_refused(pm):
    found = hal_kunlun.probe()
    assert found["native"] is False and "torch_xmlir is not installed" in found["reason"]
    with pytest.raises(hal.ChipUnavailableError, match="chip 'kunlun'.*not natively available"):
        hal.bind("kunlun", emulated=False, pm=pm)


def test_nvidia_machine_is_not_kunlun(pm, devices):
    devices.name = "NVIDIA H800"
    assert pm.native_available("cuda") is True
    assert pm.native_available("kunlun") is False
    assert hal.select_chip(pm, env={}).chip == "cuda"


def test_kunlun_machine_is_not_nvidia(pm, devices, xmlir):
    cuda_probe = hal_cuda.probe()
    assert cuda_probe["native"] is False and "torch_xmlir is installed" in cuda_probe["reason"]
    found = hal_kunlun.probe()
    assert found["native"] is True and found["device_count"] == 2 and found["adapter_version"] == "stand-in"
    assert found["sources"] and "sglang-kunlun" in found["sources"][0]
    sel = hal.select_chip(pm, env={})
    assert (sel.chip, sel.emulated) == ("kunlun", False)


def test_native_bind_records_what_it_found(pm, devices, xmlir, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "5")
    monkeypatch.setenv("XPU_VISIBLE_DEVICES", "4,5")
    acc = hal.bind("kunlun", emulated=False, pm=pm)
    assert ("set_device", 1) in devices.calls  # LOCAL_RANK 5 % 2 devices
    assert acc.device == torch.device("cuda", 1) and acc.chip.torch_device_type == "cuda"
    assert isinstance(acc.runtime, hal_kunlun.KunlunRuntime) and acc.runtime.module is torch.cuda
    # The name comes from torch_xmlir (torch.cuda's shim says 'GPU'), and picks the P800 profile.
    assert ("get_device_name", 0) in xmlir.CALLS
    assert acc.profile.model == hal.catalog.get("kunlun", "P800").model
    notes = acc.profile.notes
    assert "detected natively" in notes and "'P800', 'P800'" in notes and "'XPU_VISIBLE_DEVICES': '4,5'" in notes
    assert hal_kunlun.LAST_PROBE["device_names"] == ["P800", "P800"]
    assert acc.kernels["rms_norm"].plugin == "kunlun"
    assert acc.kernels["scaled_dot_product_attention"].priority == 0  # reference until measured


def test_unknown_kunlun_model_and_name_fallback(pm, devices, xmlir, monkeypatch):
    xmlir.NAMES[:] = ["KL3"]
    prof = hal.bind("kunlun", emulated=False, pm=pm).profile
    assert prof.model == "KL3" and prof.memory_bytes.value is None and "measured later" in prof.notes
    monkeypatch.delattr(xmlir, "get_device_name")  # a build without it: torch.cuda's name is used
    assert hal.bind("kunlun", emulated=False, pm=pm).profile.model == "GPU"


def test_nvidia_named_devices_under_torch_xmlir_are_claimed_by_nobody(pm, devices, xmlir):
    xmlir.NAMES[:] = ["NVIDIA A100-SXM4-80GB"]
    with pytest.raises(hal.ChipUnavailableError, match="NVIDIA names.*not claimed as Kunlun"):
        hal.bind("kunlun", emulated=False, pm=pm)
    assert pm.native_available("cuda") is False


def test_process_group_through_nccl_backend_with_timeout(pm, devices, xmlir):
    acc = hal.bind("kunlun", emulated=False, pm=pm)
    pg = acc.new_process_group(dist.HashStore(), 2, 8, timedelta(minutes=3))
    rec = fake_nccl.CREATED[-1]
    assert isinstance(pg, fake_nccl.FakeProcessGroupNCCL)
    assert (rec["rank"], rec["size"], rec["timeout"]) == (2, 8, timedelta(minutes=3))
    assert rec["is_high_priority_stream"] is False and rec["seq_set"]


def test_capability_matrix_declares_only_what_integrations_use():
    m = hal_kunlun.xccl_capabilities()
    assert m.supports("all_reduce", "bfloat16", "sum") and m.supports("gather", "float16")
    assert m.supports("send_recv", "float32") and m.supports("all_gather_into_tensor", "bfloat16")
    assert not m.supports("all_reduce", "float32", "max") and not m.supports("broadcast", "float32")
    assert not m.supports("all_reduce", "int64", "sum")
    assert len(m.entries) == 15 and "vLLM-Kunlun" in m.source


def test_kunlun_kernels_only_when_native(pm):
    assert not [k for k in pm.op_kernels("kunlun", emulated=True) if k.plugin == "kunlun"]
    native = {k.op for k in pm.op_kernels("kunlun", emulated=False) if k.plugin == "kunlun"}
    assert "rms_norm" in native and "scaled_dot_product_attention" not in native


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64], ids=str)
def test_kunlun_kernels_pass_the_golden_on_cpu_tensors(dtype):
    failures = [r.describe() for k in hal_kunlun.kernels.op_kernels()
                for r in golden.check_op(k.fn, k.op, dtype, k.name) if not r.ok]
    assert not failures, "\n".join(failures)
