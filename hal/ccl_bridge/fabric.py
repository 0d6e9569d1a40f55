"""The inner groups of one `hetero` group, built once at creation, plus host staging helpers.

For a group of W ranks in k sub-clusters (see `topology`), each rank holds:
- `intra`: its sub-cluster's CCL (`hal.accelerator().new_process_group`: the vendor group when the
  chip is native, the CPU fabric when emulated), wrapped in a `Ccl` with the chip's capability matrix;
- `rails`: one gloo group per rail it sits on (the cross-sub-cluster transport, host memory);
- `rails_back`: in rail mode, a second gloo group per rail, so the all_to_all rail step sends each
  direction on its own connection (`duplex`);
- `glob`: one gloo group over all W ranks, for the leader fallbacks, gather, scatter,
  cross-sub-cluster send/recv, barrier and the debug-mode agreement check.
Every inner group is built from a `PrefixStore` of the creator's store with the group's timeout, in
the same order on every rank (global, intra, rails by index, each
rail followed by its back group): gloo's constructor waits for its
peers, and a common order means no two ranks wait on each other crosswise.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Optional

import torch

from .ccl import Ccl
from .config import BridgeConfig
from .staging import DeviceSync, ScratchPool
from .topology import Topology  # hal.core.topology.RailLayout

CPU = torch.device("cpu")


@dataclass
class Fabric:
    topo: Topology
    rank: int
    config: BridgeConfig
    timeout: timedelta
    intra: Ccl
    glob: Ccl
    rails: dict[int, Ccl]
    scratch: ScratchPool
    sync: DeviceSync
    name: str = "hetero"
    global_ranks: Optional[list[int]] = None
    inner_groups: list[Any] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)  # elements moved per path (tests, describe())
    rails_back: dict[int, Ccl] = field(default_factory=dict)  # rail index -> its back group (`duplex`)
    block_a2a: bool = False  # every rank holds host tensors: rail all_to_all one message per block (backend)

    def count(self, key: str, elements: int) -> None:
        self.counters[key] = self.counters.get(key, 0) + elements

    @property
    def cluster(self) -> int:
        return self.topo.cluster_of[self.rank]

    @property
    def index(self) -> int:
        return self.topo.index_in_cluster[self.rank]

    @property
    def world(self) -> int:
        return self.topo.world_size

    def my_rails(self):
        return self.topo.rails_of(self.rank)

    def global_rank(self, group_rank: int) -> int:
        return self.global_ranks[group_rank] if self.global_ranks else group_rank

    # ---- host staging: cross-sub-cluster steps read host memory --------------------------------
    def staged(self, t: torch.Tensor) -> bool:
        """Whether `t` goes through host staging: device tensors always; CPU tensors (emulated chips)
        only with HAL_BRIDGE_FORCE_STAGING=1, which runs the native chips' copy path in tests."""
        return t.device.type != "cpu" or self.config.force_staging

    def to_host(self, t: torch.Tensor, slot: Any) -> torch.Tensor:
        """`t` itself for a CPU tensor (emulated chips), else a pinned staging copy (async; call
        `host_ready()` before a gloo op reads it)."""
        if not self.staged(t):
            return t
        h = self.scratch.get(("host", slot), t.numel(), t.dtype, CPU)
        h.copy_(t.reshape(-1), non_blocking=True)
        return h

    def host_ready(self) -> None:
        self.sync.host_ready()

    def from_host(self, h: torch.Tensor, t: torch.Tensor) -> None:
        if h is t or (h.device == t.device and h.data_ptr() == t.data_ptr()):
            return
        t.view(-1).copy_(h, non_blocking=True)

    def host_buffer(self, slot: Any, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return self.scratch.get(("host", slot), numel, dtype, CPU)
