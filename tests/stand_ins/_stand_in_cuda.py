"""torch.cuda patched (pytest monkeypatch) to show CUDA devices on a CPU-only build, recording calls.

Used for the NVIDIA path (hal_cuda) and for KunlunXin's build, which shows its XPUs as torch `cuda`
devices too. Only functions the plugins and the accelerator call are patched; torch.distributed's
ProcessGroupNCCL becomes `_stand_in_nccl.FakeProcessGroupNCCL`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.cuda.nccl
import torch.distributed as dist

from . import _stand_in_nccl


@dataclass
class CudaState:
    count: int = 2
    name: str = "NVIDIA H100 80GB HBM3"
    capability: tuple = (9, 0)
    nccl: tuple = (2, 27, 3)
    current: int = 0
    calls: list = field(default_factory=list)


def patch_torch_cuda(monkeypatch, state: CudaState) -> CudaState:
    def set_device(index):
        state.calls.append(("set_device", index))
        state.current = int(index)

    def get_device_name(index=None):
        state.calls.append(("get_device_name", index))
        return state.name

    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: state.count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: state.count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: state.current)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    monkeypatch.setattr(torch.cuda, "get_device_name", get_device_name)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: state.capability)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index=None: (3 * 2**30, 80 * 2**30))
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: state.nccl)
    monkeypatch.setattr(dist, "ProcessGroupNCCL", _stand_in_nccl.FakeProcessGroupNCCL, raising=False)
    _stand_in_nccl.CREATED.clear()
    return state
