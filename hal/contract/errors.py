"""Typed errors of the HAL: each names what was wrong and where (plugin, hook, field, value)."""
from __future__ import annotations

from typing import Any, Optional


class HalError(Exception):
    """Base of every error the HAL raises on purpose."""


class PluginValidationError(HalError):
    """A plugin was refused at registration; the message names plugin, hook and what was wrong."""

    def __init__(self, plugin: str, hook: str | None, problem: str):
        self.plugin, self.hook, self.problem = plugin, hook, problem
        where = f"plugin {plugin!r}" + (f", hook {hook!r}" if hook else "")
        super().__init__(f"{where}: {problem}")


class PluginHookError(HalError):
    """A plugin's hook raised when called; the message names plugin, hook and the original error."""

    def __init__(self, plugin: str, hook: str, problem: str):
        self.plugin, self.hook = plugin, hook
        super().__init__(f"plugin {plugin!r}, hook {hook!r}: {problem}")


class ContractVersionError(PluginValidationError):
    """A plugin implements a contract version this HAL cannot load."""


class DuplicateChipError(PluginValidationError):
    """Two plugins claim the same chip name."""


class ProfileValidationError(PluginValidationError):
    """A chip's profile does not validate against `ChipProfile`."""


class UnknownChipError(HalError, LookupError):
    """A chip name that no registered plugin provides."""


class ChipUnavailableError(HalError):
    """A chip was asked for natively but is not present on this machine."""


class TorchVersionError(HalError):
    """The installed torch is outside what the HAL or a plugin's vendor stack supports (names both)."""


class ChipSelectionError(HalError, ValueError):
    """HAL_CHIP / HAL_EMULATE / the cluster spec could not be turned into a chip for this rank."""


class UnknownOpError(HalError, LookupError):
    """An op name that the HAL ops interface does not define."""


class NotSupportedError(HalError, NotImplementedError):
    """A capability (collective x dtype x reduce op, or a runtime feature) the chip does not offer."""


class ClusterSpecError(HalError, ValueError):
    """A cluster spec file is invalid; the message names field, value and (where known) line. The
    spec parser sets `source` (file), `field`, `value` and `line` on the error it raises."""

    source: str
    field: Optional[str]
    value: Any
    line: Optional[int]


# ---- what a survivor sees when a peer of a collective fails, on any fabric --------------------------
# The chips' CCLs (hal.emulation.shm for the emulated ones) and the `hetero` bridge (hal.ccl_bridge.errors) raise
# their own typed errors, with their own fields; both derive from these two, so a trainer catches one
# type whichever side of the bridge the failed collective ran on (a DP group inside one sub-cluster is
# that chip's CCL itself, the bridge passes single-chip groups through).
class CollectivePeerError(HalError):
    """A peer of a collective or send/recv died or raised, or the group is unusable after an earlier
    failure (ShmPeerDiedError, ShmAbortedError, BridgePeerError)."""


class CollectiveTimeoutError(HalError, TimeoutError):
    """A collective or send/recv did not finish within its group's bound: a peer is frozen, dead or
    behind (ShmTimeoutError, BridgeTimeoutError)."""


# ---- one definition of how a pydantic location is named in an error message ---------------------
def field_path(loc) -> str:
    """('stages', 1, 'layers') -> 'stages[1].layers' (used by the cluster spec, Plan and configs)."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def value_at(data, loc):
    """The value at a pydantic location in the raw input, or None where there is none."""
    for part in loc:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
    return data
