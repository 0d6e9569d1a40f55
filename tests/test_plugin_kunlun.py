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
import os
import sys
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

_acc_module = importlib.import_module("hal.core.selection")


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
    hal_kunlun.PLUGIN.chip.last_probe = None


@pytest.fixture
def xmlir(monkeypatch):
    """The stand-in torch_xmlir on sys.path (a KunlunXin PyTorch build), two 'P800' XPUs. The stack
    ships its own torch 2.5.1, so torch's version reads as that one (hal_kunlun refuses any other)."""
    monkeypatch.setattr(torch, "__version__", "2.5.1")
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
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    acc = hal.bind("kunlun", emulated=False, pm=pm)
    assert ("set_device", 1) in devices.calls  # LOCAL_RANK 5 % 2 devices
    assert acc.device == torch.device("cuda", 1) and acc.chip.torch_device_type == "cuda"
    assert isinstance(acc.runtime, hal_kunlun.KunlunRuntime) and acc.runtime.module is torch.cuda
    # The name comes from torch_xmlir (torch.cuda's shim says 'GPU'), and picks the P800 profile.
    assert xmlir.CALLS == [("get_device_name", 1)]  # the selected device only
    assert acc.profile.model == hal.core.catalog.get("kunlun", "P800").model
    notes = acc.profile.notes
    assert "detected natively" in notes and "'device_name': 'P800'" in notes and "'XPU_VISIBLE_DEVICES': '4,5'" in notes
    assert hal_kunlun.PLUGIN.chip.last_probe["device_name"] == "P800"
    assert acc.kernels["rms_norm"].plugin == "kunlun"
    assert acc.kernels["scaled_dot_product_attention"].priority == 0  # reference until measured


def test_no_device_touched_before_selection(pm, devices, xmlir, monkeypatch):
    """hal_device_runtime (and the probe it runs) touches no device: a device's name is read only
    after set_device selected this rank's device, and only that device's (the contract,
    hal.contract.hookspecs `hal_device_runtime`). Failed before (checked against the previous plugin):
    the bind-time probe read every device's name, through torch_xmlir, before selection."""
    monkeypatch.setenv("LOCAL_RANK", "1")
    read = []
    real = xmlir.get_device_name

    def get_device_name(device=None):
        read.append((device, [c for c in devices.calls if c[0] == "set_device"]))
        return real(device)
    monkeypatch.setattr(xmlir, "get_device_name", get_device_name)
    hal_kunlun.hal_device_runtime("kunlun")
    assert read == [] and devices.fork_poisoned_by == [], (read, devices.fork_poisoned_by)
    hal.bind("kunlun", emulated=False, pm=pm)
    assert read == [(1, [("set_device", 1)])], read


def test_unknown_kunlun_model_and_name_fallback(pm, devices, xmlir, monkeypatch):
    xmlir.NAMES[:] = ["XPU-Q9"]
    prof = hal.bind("kunlun", emulated=False, pm=pm).profile
    assert prof.model == "XPU-Q9" and prof.memory_bytes.value is None and "measured later" in prof.notes
    monkeypatch.delattr(xmlir, "get_device_name")  # a build without it: torch.cuda's name is used
    assert hal.bind("kunlun", emulated=False, pm=pm).profile.model == "GPU"


def test_nvidia_named_devices_under_torch_xmlir_are_claimed_by_nobody(pm, devices, xmlir):
    xmlir.NAMES[:] = ["NVIDIA A100-SXM4-80GB"]
    with pytest.raises(hal.ChipUnavailableError, match="NVIDIA name.*not claimed as Kunlun"):
        hal.bind("kunlun", emulated=False, pm=pm)
    assert pm.native_available("cuda") is False


def test_p800_reporting_kl3_gets_the_p800_profile(pm, devices, xmlir):
    """A P800 that names itself 'KL3' (its generation's name in KunlunXin's software) is a P800
    (failed before: an unknown model with every figure unknown)."""
    xmlir.NAMES[:] = ["KL3", "KL3"]
    assert hal.bind("kunlun", emulated=False, pm=pm).profile.model == hal.core.catalog.get("kunlun", "P800").model


def test_process_group_through_the_registered_creator(pm, devices, xmlir):
    """torch_xmlir swaps ProcessGroupNCCL and registers its creator for `nccl`: the group is built
    through that creator as _new_process_group_helper calls it (group id, global ranks, timeout),
    never from torch.distributed.ProcessGroupNCCL (failed before: the stand-in NCCL class was built)."""
    acc = hal.bind("kunlun", emulated=False, pm=pm)
    pg = acc.new_process_group(dist.HashStore(), 2, 8, timedelta(minutes=3), global_ranks=list(range(8, 16)),
                               group_name="hetero/intra/1")
    assert type(pg).__name__ == "XmlirProcessGroupNCCL"
    assert sys.modules["torch_xmlir"].CREATED[-1] == {"via": "creator", "group_name": "hetero/intra/1",
                                                      "timeout": timedelta(minutes=3)}
    rec = fake_nccl.CREATED[-1]
    assert (rec["rank"], rec["size"], rec["timeout"]) == (2, 8, timedelta(minutes=3))
    assert rec["global_ranks_in_group"] == list(range(8, 16)) and rec["class"] == "XmlirProcessGroupNCCL"


def test_process_group_without_a_creator_uses_the_class_torch_would(pm, devices, xmlir, monkeypatch):
    monkeypatch.delitem(dist.Backend._plugins, "NCCL")
    acc = hal.bind("kunlun", emulated=False, pm=pm)
    pg = acc.new_process_group(dist.HashStore(), 0, 2, timedelta(seconds=30), global_ranks=[4, 5], group_name="g")
    rec = fake_nccl.CREATED[-1]
    assert type(pg).__name__ == "XmlirProcessGroupNCCL" and rec["seq_set"] and rec["group_name"] == "g"
    assert rec["is_high_priority_stream"] is False and rec["global_ranks_in_group"] == [4, 5]


def test_xccl_timeouts_derived_from_the_hal_timeout(pm, devices, xmlir, monkeypatch):
    """BKCL_TIMEOUT = the HAL timeout in seconds, and a timeout that raises instead of tearing the
    process down (failed before: nothing was set)."""
    for var in ("BKCL_TIMEOUT", "TORCH_XCCL_ASYNC_ERROR_HANDLING"):
        monkeypatch.delenv(var, raising=False)
    acc = hal.bind("kunlun", emulated=False, pm=pm)
    pg = acc.new_process_group(dist.HashStore(), 0, 2, timedelta(minutes=3), global_ranks=[0, 1], group_name="g")
    assert os.environ["BKCL_TIMEOUT"] == "180" and pg.async_error_handling == 2
    assert os.environ["TORCH_XCCL_ASYNC_ERROR_HANDLING"] == "2"
    monkeypatch.setenv("BKCL_TIMEOUT", "1800")
    with pytest.warns(RuntimeWarning, match="BKCL_TIMEOUT=1800 .* replaced by 60"):
        acc.new_process_group(dist.HashStore(), 0, 2, timedelta(minutes=1), global_ranks=[0, 1], group_name="g")


def test_visible_devices_set_as_kunlun_integrations_set_them(devices, xmlir, monkeypatch):
    """XPU_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES name the same XPUs before the runtime starts
    (failed before: only one was set and the layers could number devices differently)."""
    monkeypatch.setenv("XPU_VISIBLE_DEVICES", "4,5")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    found = hal_kunlun.probe()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5" and found["native"] is True
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    found = hal_kunlun.probe()
    assert found["native"] is False and "XPU_VISIBLE_DEVICES='4,5' and CUDA_VISIBLE_DEVICES='0,1' differ" in found["reason"]
    monkeypatch.delenv("XPU_VISIBLE_DEVICES")
    hal_kunlun.probe()
    assert os.environ["XPU_VISIBLE_DEVICES"] == "0,1"
    assert devices.fork_poisoned_by == []  # counted without is_available()


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
    failures = [r.describe() for k in hal_kunlun.PLUGIN.chip.op_kernels(emulated=False)
                for r in golden.check_op(k.fn, k.op, dtype, k.name) if not r.ok]
    assert not failures, "\n".join(failures)


def test_a_torch_the_kunlun_stack_does_not_ship_is_refused_in_one_line(pm, devices, xmlir, monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")  # stock torch under a Kunlun build: refused
    found = hal_kunlun.probe()
    assert not found["native"]
    assert "torch 2.13.0+cpu is not supported by the KunlunXin stack" in found["reason"]
    assert ">= 2.5, < 2.6" in found["reason"] and "\n" not in found["reason"]
    with pytest.raises(hal.ChipUnavailableError, match="not natively available"):
        hal.bind("kunlun", pm=pm)
