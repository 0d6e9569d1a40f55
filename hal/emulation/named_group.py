"""`NamedProcessGroup`: a Python `dist.ProcessGroup` that keeps its own group name and description.

torch's C++ `ProcessGroup` stores a group's name and description on its backend, which a Python
subclass implementing the collectives itself does not have; `dist.new_group` and
`dist.init_process_group` call `setGroupName`/`setGroupDesc` on the group they build and read them
back. The CPU fabrics (`StridedSafeGloo`, `ShmProcessGroup`) subclass this and add only their
backend name and collectives.
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
