"""The contract's version and the metadata a plugin declares (`PluginInfo`)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

# MAJOR.MINOR. A plugin built for MAJOR.m loads if MAJOR matches and m <= our MINOR: minor versions
# only add optional hooks or optional fields; a major bump changes a required hook.
CONTRACT_VERSION = "1.0"


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
