"""The bridge's settings (environment switches, or a `BridgeConfig` passed as `pg_options`).

| variable | default | meaning |
|---|---|---|
| `HAL_BRIDGE_SMALL_BYTES` | 65536 | all_reduce of at most this many bytes takes the single-leader path |
| `HAL_BRIDGE_CHUNK_BYTES` | 4194304 | the rail path moves large messages in chunks of about this size |
| `HAL_BRIDGE_PIPELINE_DEPTH` | 2 | chunks in flight at once on the rail path (bounds staging memory) |
| `HAL_BRIDGE_WIRE_DTYPE` | (unset) | `bf16`: float32 SUM/AVG cross sub-clusters as bfloat16, accumulated in float32 |
| `HAL_BRIDGE_DEBUG` | 0 | `1`: check op/dtype/shape/sequence agreement across ranks before each collective |
| `HAL_BRIDGE_GRACE_S` | 5 | seconds a waiter allows beyond the group's timeout before raising BridgeTimeoutError |
| `HAL_BRIDGE_FORCE_STAGING` | 0 | `1`: copy CPU tensors through host staging too, as for a native chip (tests the native copy path on emulated chips) |
| `HAL_BRIDGE_MAX_PARTS` | 256 | most parts (lcm of the sub-cluster sizes) for the rail paths; above it (odd uneven sizes such as 97+64) the group runs leader-only |

Every rank must use the same values (they choose algorithms); group creation checks this and raises
`BridgeConfigError` naming each rank's values otherwise.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace
from typing import Mapping, Optional

from hal.core.topology import DEFAULT_MAX_PARTS

from .errors import BridgeConfigError

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class BridgeConfig:
    small_bytes: int = 64 * 1024
    chunk_bytes: int = 4 * 1024 * 1024
    pipeline_depth: int = 2
    wire_dtype: Optional[str] = None  # None or "bfloat16"
    debug: bool = False
    grace_s: float = 5.0
    max_parts: int = DEFAULT_MAX_PARTS
    force_staging: bool = False

    def __post_init__(self) -> None:
        if self.small_bytes < 0:
            raise BridgeConfigError(f"small_bytes={self.small_bytes}: must be >= 0")
        if self.chunk_bytes < 1024:
            raise BridgeConfigError(f"chunk_bytes={self.chunk_bytes}: must be >= 1024")
        if not 1 <= self.pipeline_depth <= 16:
            raise BridgeConfigError(f"pipeline_depth={self.pipeline_depth}: must be in 1..16")
        if self.wire_dtype not in (None, "bfloat16"):
            raise BridgeConfigError(f"wire_dtype={self.wire_dtype!r}: expected None or 'bfloat16'")
        if self.grace_s < 0:
            raise BridgeConfigError(f"grace_s={self.grace_s}: must be >= 0")
        if self.max_parts < 1:
            raise BridgeConfigError(f"max_parts={self.max_parts}: must be >= 1")

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> "BridgeConfig":
        env = os.environ if env is None else env
        kw: dict = {}
        for name, key, conv in (("HAL_BRIDGE_SMALL_BYTES", "small_bytes", int),
                                ("HAL_BRIDGE_CHUNK_BYTES", "chunk_bytes", int),
                                ("HAL_BRIDGE_PIPELINE_DEPTH", "pipeline_depth", int),
                                ("HAL_BRIDGE_GRACE_S", "grace_s", float),
                                ("HAL_BRIDGE_MAX_PARTS", "max_parts", int)):
            text = (env.get(name) or "").strip()
            if text:
                try:
                    kw[key] = conv(text)
                except ValueError:
                    raise BridgeConfigError(f"{name}={text!r} is not a number") from None
        wire = (env.get("HAL_BRIDGE_WIRE_DTYPE") or "").strip().lower()
        if wire in ("bf16", "bfloat16"):
            kw["wire_dtype"] = "bfloat16"
        elif wire not in ("", "none", "off", "fp32", "float32"):
            raise BridgeConfigError(f"HAL_BRIDGE_WIRE_DTYPE={wire!r}: expected 'bf16' or unset")
        for name, key in (("HAL_BRIDGE_DEBUG", "debug"), ("HAL_BRIDGE_FORCE_STAGING", "force_staging")):
            text = (env.get(name) or "").strip().lower()
            if text not in _TRUE + _FALSE:
                raise BridgeConfigError(f"{name}={text!r}: expected 0 or 1")
            kw[key] = text in _TRUE
        return cls(**kw)

    def with_(self, **changes) -> "BridgeConfig":
        return replace(self, **changes)

    def agreement_key(self) -> dict:
        """What must agree across ranks: what picks algorithms (not the local waiter's grace, nor
        whether this rank's tensors go through host staging)."""
        d = asdict(self)
        d.pop("grace_s")
        d.pop("force_staging")
        return d
