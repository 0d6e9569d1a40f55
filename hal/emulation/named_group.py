"""`NamedProcessGroup`: a Python `dist.ProcessGroup` that keeps its own group name and description.

torch's C++ `ProcessGroup` stores a group's name and description on its backend, which a Python
subclass implementing the collectives itself does not have; `dist.new_group` and
`dist.init_process_group` call `setGroupName`/`setGroupDesc` on the group they build and read them
back. The CPU fabrics (`StridedSafeGloo`, `ShmProcessGroup`) and the bridge's `HeteroProcessGroup`
subclass this and add their backend name and collectives.
"""
from __future__ import annotations

import torch.distributed as dist


class NamedProcessGroup(dist.ProcessGroup):
    """`dist.ProcessGroup(rank, size)` whose name and description (both "" at first) live here."""

    def __init__(self, rank: int, size: int):
        super().__init__(rank, size)
        self._group_name = ""
        self._group_desc = ""

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupDesc(self) -> str:
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    # torch 2.5's C++ ProcessGroup keeps name and description on its backends only, which a Python
    # group has none of (its `group_name` raised "ProcessGroup name not set" in destroy_process_group),
    # and c10d sets and reads them from Python through these: answered here on every torch.
    def _set_group_name(self, name: str) -> None:
        self.setGroupName(name)

    def _set_group_desc(self, desc: str) -> None:
        self.setGroupDesc(desc)

    @property
    def group_name(self) -> str:
        return self.getGroupName()

    @property
    def group_desc(self) -> str:
        return self.getGroupDesc()
