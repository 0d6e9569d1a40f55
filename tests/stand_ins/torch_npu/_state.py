"""What the torch_npu stand-in pretends the machine has, and its call record (tests set and read it)."""
from __future__ import annotations

from dataclasses import dataclass, field

from _stand_in_recorder import Recorder  # top-level: this folder is on sys.path


@dataclass
class NpuState:
    device_count: int = 1
    device_name: str = "Ascend910B2"
    current: int = 0
    free_bytes: int = 60 * 2**30
    total_bytes: int = 64 * 2**30
    record: Recorder = field(default_factory=Recorder)
    last_atten_mask: object = None  # the tensor the last npu_fusion_attention call received


STATE = NpuState()
