"""Who is where in a `hetero` group: each rank's chip identity (exchanged at group creation), and the
group's sub-clusters and rails, which come from `hal.core.topology` (the one definition of rails, homes
and sub-cluster grouping that `hal cluster show`, `Topology.from_spec(spec).rails`, the strategies and the
planner use too; its module docstring explains parts, homes and rails for uneven sizes).

Ranks with the same chip *and* the same emulated flag share one vendor CCL fabric (an emulated chip's
fabric is the CPU one, so it cannot share a group with a native chip of the same name): that pair is
the key `hal.core.topology.rail_layout` groups by. Group ranks are positions in the group, so a subgroup
gets the layout of its own members.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from hal.core.topology import DEFAULT_MAX_PARTS, ChipGroup, Rail, RailLayout, rail_layout

# The bridge's names for hal.core.topology's types (one definition, two spellings kept for callers).
Topology = RailLayout
SubCluster = ChipGroup

__all__ = ["RankIdentity", "Topology", "SubCluster", "Rail", "build_topology"]


@dataclass(frozen=True)
class RankIdentity:
    """What a rank tells the others at group creation."""

    chip: str
    emulated: bool
    device_type: str
    host: str
    ccl_backend: str = ""

    @property
    def key(self) -> tuple[str, bool]:
        return (self.chip, self.emulated)

    def label(self) -> str:
        return f"{self.chip}{' (emulated)' if self.emulated else ''}"

    def to_dict(self) -> dict:
        return {"chip": self.chip, "emulated": self.emulated, "device_type": self.device_type,
                "host": self.host, "ccl_backend": self.ccl_backend}

    @classmethod
    def from_dict(cls, d: dict) -> "RankIdentity":
        return cls(chip=str(d["chip"]), emulated=bool(d["emulated"]), device_type=str(d["device_type"]),
                   host=str(d["host"]), ccl_backend=str(d.get("ccl_backend", "")))


def build_topology(identities: Sequence[RankIdentity], max_parts: int = DEFAULT_MAX_PARTS) -> RailLayout:
    """Sub-clusters and rails for group ranks 0..len(identities)-1 (`hal.core.topology.rail_layout`)."""
    if not identities:
        raise ValueError("a hetero group needs at least one rank")
    return rail_layout([ident.key for ident in identities], max_parts)
