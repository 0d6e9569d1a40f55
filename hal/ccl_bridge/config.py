"""The bridge's settings (environment switches, or a `BridgeConfig` passed as `pg_options`).

Each field's variable (`HAL_BRIDGE_SMALL_BYTES`, `_CHUNK_BYTES`, `_PIPELINE_DEPTH`, `_WIRE_DTYPE`,
`_DEBUG`, `_GRACE_S`, `_FORCE_STAGING`, `_MAX_PARTS`), its default and meaning are declared in hal.envs
(docs/environment.md lists them).

Every rank must use the same values (they choose algorithms); group creation checks this and raises
`BridgeConfigError` naming each rank's values otherwise.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping, Optional

from hal import envs

from .errors import BridgeConfigError


@dataclass(frozen=True)
class BridgeConfig:
    small_bytes: int = envs.HAL_BRIDGE_SMALL_BYTES.default
    chunk_bytes: int = envs.HAL_BRIDGE_CHUNK_BYTES.default
    pipeline_depth: int = envs.HAL_BRIDGE_PIPELINE_DEPTH.default
    wire_dtype: Optional[str] = envs.HAL_BRIDGE_WIRE_DTYPE.default  # None or "bfloat16"
    debug: bool = envs.HAL_BRIDGE_DEBUG.default
    grace_s: float = envs.HAL_BRIDGE_GRACE_S.default
    max_parts: int = envs.HAL_BRIDGE_MAX_PARTS.default
    force_staging: bool = envs.HAL_BRIDGE_FORCE_STAGING.default

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
        """The settings the HAL_BRIDGE_* variables give (a bad value raises BridgeConfigError)."""
        def get(var: envs.EnvVar) -> Any:
            return var.get(env, error=BridgeConfigError)
        return cls(small_bytes=get(envs.HAL_BRIDGE_SMALL_BYTES), chunk_bytes=get(envs.HAL_BRIDGE_CHUNK_BYTES),
                   pipeline_depth=get(envs.HAL_BRIDGE_PIPELINE_DEPTH), grace_s=get(envs.HAL_BRIDGE_GRACE_S),
                   max_parts=get(envs.HAL_BRIDGE_MAX_PARTS), wire_dtype=get(envs.HAL_BRIDGE_WIRE_DTYPE),
                   debug=get(envs.HAL_BRIDGE_DEBUG), force_staging=get(envs.HAL_BRIDGE_FORCE_STAGING))

    def agreement_key(self) -> dict:
        """What must agree across ranks: what picks algorithms (not the local waiter's grace, nor
        whether this rank's tensors go through host staging)."""
        d = asdict(self)
        d.pop("grace_s")
        d.pop("force_staging")
        return d
