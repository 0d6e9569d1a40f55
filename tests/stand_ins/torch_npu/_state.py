"""What the torch_npu stand-in pretends the machine has, and its call record (tests set and read it)."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from _stand_in_recorder import Recorder  # top-level: this folder is on sys.path

# c10_npu::SocVersion (torch_npu/csrc/core/npu/NpuVariables.h, Ascend/pytorch@9e73e708).
SOC_VERSIONS = {"Ascend910A": 102, "Ascend910ProB": 103, "Ascend910B1": 220, "Ascend910B2": 221,
                "Ascend910B3": 223, "Ascend910B4": 224, "Ascend910_9391": 250, "Ascend910_9392": 251,
                "Ascend910_9362": 255, "Ascend950": 260}


@dataclass
class NpuState:
    device_count: int = 1
    device_name: str = "Ascend910B2"
    free_bytes: int = 60 * 2**30
    total_bytes: int = 64 * 2**30
    initialized: bool = False
    contexts: list = field(default_factory=list)   # devices a context was opened on, in order
    record: Recorder = field(default_factory=Recorder)
    last_atten_mask: object = None  # the tensor the last npu_fusion_attention call received
    exec_timeout_first_read: object = None  # HCCL_EXEC_TIMEOUT as torch_npu fixed it (first group)
    async_error_handling_first_read: object = None  # TORCH_HCCL_ASYNC_ERROR_HANDLING, fixed at the first group
    teardowns: list = field(default_factory=list)  # what the HCCL watchdog would have killed the process for
    _tls: threading.local = field(default_factory=threading.local)

    @property
    def current(self) -> int:
        """This thread's current device (per thread, as aclrtSetDevice is); 0 until set."""
        return getattr(self._tls, "current", 0)

    @current.setter
    def current(self, index: int) -> None:
        self._tls.current = index

    @property
    def soc_version(self) -> int:
        return SOC_VERSIONS.get(self.device_name, -1)

    def open_context(self, index: int, why: str) -> None:
        if index not in self.contexts:
            self.contexts.append(index)
            self.record.record("context_opened", index, why=why)
        self.initialized = True

    def reset(self) -> None:
        self.initialized = False
        self.contexts.clear()
        self.current = 0
        self.exec_timeout_first_read = None
        self.async_error_handling_first_read = None
        self.teardowns.clear()
        self.record.clear()


STATE = NpuState()
