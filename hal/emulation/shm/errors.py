"""Typed errors of the shared-memory fabric; each names the rank, op, sequence number and peer.

The C++ extension raises these directly (its exception translator imports this module), so code
can catch `ShmTimeoutError` or, more broadly, `HalError`. A dead or aborted peer is also a
`hal.contract.errors.CollectivePeerError`, a timeout a `hal.contract.errors.CollectiveTimeoutError`: the bridge's
errors share those bases.
"""
from __future__ import annotations

from typing import Optional

from hal.contract.errors import CollectivePeerError, CollectiveTimeoutError, HalError, NotSupportedError


class ShmError(HalError):
    """Base of the shm fabric's errors. `rank`: the rank that raised; `op`: the collective or p2p op;
    `seq`: its sequence number in the group; `peer`: the rank at fault, where one is known."""

    def __init__(self, message: str, *, rank: Optional[int] = None, op: Optional[str] = None,
                 seq: Optional[int] = None, peer: Optional[int] = None):
        super().__init__(message)
        self.rank, self.op, self.seq, self.peer = rank, op, seq, peer


class ShmTimeoutError(ShmError, CollectiveTimeoutError):
    """A peer did not arrive (or a send/recv made no progress) within the group's timeout."""


class ShmPeerDiedError(ShmError, CollectivePeerError):
    """A peer process exited or was killed while this rank waited for it."""


class ShmMismatchError(ShmError, ValueError):
    """Ranks called different collectives, or with different sizes, dtypes, ops, roots or splits."""


class ShmAbortedError(ShmError, CollectivePeerError):
    """The group was aborted earlier (by this rank or a peer, for the reason in the message)."""


class ShmSetupError(ShmError):
    """The group could not be created: ranks on different hosts, segment not mappable, bad sizes."""


class ShmUnsupportedError(ShmError, NotSupportedError):
    """A dtype x reduce op the shm kernels do not implement (for example AVG on integers)."""
