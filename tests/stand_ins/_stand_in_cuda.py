"""torch.cuda patched (pytest monkeypatch) to show CUDA devices on a CPU-only build, recording calls.

Used for the NVIDIA path (hal_cuda) and for KunlunXin's build, which shows its XPUs as torch `cuda`
devices too. Only functions the plugins and the accelerator call are patched. What "poisons fork"
is recorded as torch documents it (torch/cuda/__init__.py, v2.13.0): `is_available()` calls
`cudaGetDeviceCount` (which runs `cuInit`) unless PYTORCH_NVML_BASED_CUDA_CHECK=1, while
`device_count()` counts through NVML before CUDA is initialised. ProcessGroupNCCL becomes
`_stand_in_nccl.FakeProcessGroupNCCL`, both where `torch.distributed` exports it and where
`distributed_c10d._new_process_group_helper` looks it up.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.cuda.nccl
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from . import _stand_in_nccl


@dataclass
class CudaState:
    count: int = 2
    name: str = "NVIDIA H100 80GB HBM3"
    capability: tuple = (9, 0)
    nccl: tuple = (2, 27, 3)
    current: int = 0
    initialized: bool = False
    calls: list = field(default_factory=list)
    fork_poisoned_by: list = field(default_factory=list)  # the calls that ran cuInit before a fork


def patch_torch_cuda(monkeypatch, state: CudaState) -> CudaState:
    def init(why: str):
        if not state.initialized:
            state.fork_poisoned_by.append(why)
        state.initialized = True

    def set_device(index):
        state.calls.append(("set_device", index))
        init("set_device")
        state.current = int(index)

    def current_device():
        state.calls.append(("current_device",))
        init("current_device")
        return state.current

    def get_device_name(index=None):
        state.calls.append(("get_device_name", index))
        init("get_device_name")
        return state.name

    def is_available():
        state.calls.append(("is_available",))
        init("is_available (cudaGetDeviceCount)")
        return state.count > 0

    def raw_count():
        init("torch._C._cuda_getDeviceCount")
        return state.count

    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "_is_compiled", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", is_available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: state.count)   # NVML-based: no cuInit
    def private_nvml_count():
        state.calls.append(("torch.cuda._device_count_nvml (private)",))
        return state.count

    monkeypatch.setattr(torch.cuda, "_device_count_nvml", private_nvml_count)
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", raw_count, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", current_device)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    monkeypatch.setattr(torch.cuda, "get_device_name", get_device_name)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: state.initialized)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: state.capability)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index=None: (3 * 2**30, 80 * 2**30))
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: state.nccl)
    monkeypatch.setattr(dist, "ProcessGroupNCCL", _stand_in_nccl.FakeProcessGroupNCCL, raising=False)
    monkeypatch.setattr(c10d, "ProcessGroupNCCL", _stand_in_nccl.FakeProcessGroupNCCL, raising=False)
    # Variables the plugins set for the process: unset now, restored after the test (setenv first
    # so that monkeypatch records the undo even when the variable was absent).
    for var in ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_BLOCKING_WAIT", "TORCH_XCCL_ASYNC_ERROR_HANDLING",
                "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_XCCL_DUMP_ON_TIMEOUT", "TORCH_NCCL_ENABLE_MONITORING",
                "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC",
                "TORCH_NCCL_COORD_CHECK_MILSEC", "BKCL_TIMEOUT", "CUDA_VISIBLE_DEVICES", "XPU_VISIBLE_DEVICES"):
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    _stand_in_nccl.reset()
    return state
