"""The contract's version, the metadata a plugin declares (`PluginInfo`) and the argument checks of
`hal_create_process_group` every plugin shares."""
from __future__ import annotations

from datetime import timedelta
from typing import Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field

# MAJOR.MINOR. A plugin built for MAJOR.m loads if MAJOR matches and m <= our MINOR: minor versions
# only add optional hooks, optional fields or hook arguments (pluggy lets an implementation take
# fewer arguments than the spec); a major bump changes a required hook.
# 1.1: hal_create_process_group gains `global_ranks` and `group_name`.
CONTRACT_VERSION = "1.1"


class PluginInfo(BaseModel):
    """What a plugin says about itself (hook `hal_plugin_info`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    version: str
    contract_version: str = Field(pattern=r"^\d+\.\d+$")
    description: str = ""


def parse_version(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def compatible(plugin_version: str, ours: str = CONTRACT_VERSION) -> bool:
    """True if a plugin written for contract `plugin_version` can be loaded by contract `ours`."""
    pmaj, pmin = parse_version(plugin_version)
    omaj, omin = parse_version(ours)
    return pmaj == omaj and pmin <= omin


def check_process_group_args(chip: str, rank: int, world_size: int, timeout: timedelta,
                             global_ranks: Optional[Sequence[int]] = None,
                             group_name: Optional[str] = None) -> tuple[list[int], str]:
    """The checks every `hal_create_process_group` implementation needs: refuse arguments no CCL can
    use, naming the field and the value. Returns the global ranks (0..world_size-1 when a contract
    1.0 caller gave none) and the group name."""
    where = f"chip {chip!r}, hook 'hal_create_process_group'"
    if not isinstance(timeout, timedelta) or timeout.total_seconds() <= 0:
        raise ValueError(f"{where}: timeout must be a positive datetime.timedelta, got {timeout!r}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"{where}: rank {rank} is not in [0, world_size={world_size})")
    ranks = list(range(world_size)) if global_ranks is None else [int(r) for r in global_ranks]
    if len(ranks) != world_size or len(set(ranks)) != world_size:
        raise ValueError(f"{where}: global_ranks={ranks} must list {world_size} distinct ranks")
    if group_name is None or not str(group_name):
        raise ValueError(f"{where}: group_name must be a non-empty name shared by every member, got "
                         f"{group_name!r} (a per-process counter differs between processes)")
    return ranks, str(group_name)
