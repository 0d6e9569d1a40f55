"""Typed errors of the `hetero` bridge: each names the group, the op, its sequence number and the stage."""
from __future__ import annotations

from hal.contract.errors import CollectivePeerError, CollectiveTimeoutError, HalError


class BridgeError(HalError):
    """Base of every error the bridge raises on purpose."""


class BridgeConfigError(BridgeError, ValueError):
    """The bridge's settings are invalid or differ between ranks (they must agree: they pick algorithms)."""


class BridgeCollectiveError(BridgeError):
    """A collective failed. `op`, `seq` (this group's collective number), `stage` (which inner step,
    e.g. "rail all_reduce with ranks [1, 3]") and `group` say where; the original error is chained."""

    def __init__(self, message: str, *, op: str = "", seq: int = -1, stage: str = "", group: str = ""):
        self.op, self.seq, self.stage, self.group = op, seq, stage, group
        super().__init__(message)


class BridgeTimeoutError(BridgeCollectiveError, CollectiveTimeoutError):
    """A collective did not finish within the group's timeout (plus the bridge's grace): a peer is
    frozen, dead or behind."""


class BridgePeerError(BridgeCollectiveError, CollectivePeerError):
    """A peer failed (connection reset, peer raised) or the group is unusable after an earlier failure."""


class BridgeMismatchError(BridgeCollectiveError):
    """HAL_BRIDGE_DEBUG found ranks calling different collectives (op, dtype, shape or sequence number)."""
