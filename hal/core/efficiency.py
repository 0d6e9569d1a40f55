"""The efficiency matrix: what a chip measurably achieves under its plugin (the perf level writes it).

A planner reads it next to the chip's profile (published peaks): achieved matmul FLOP/s by dtype and
shape, memory bandwidth, and collective bus bandwidth by message size (nccl-tests' busbw: algbw x
2(n-1)/n for all_reduce, x (n-1)/n for all_gather / reduce_scatter / all_to_all, x 1 for broadcast).
Versioned: `schema_version` changes its major number when a field changes meaning; readers refuse a
major they do not know. An emulated chip's matrix measures the host, and says so (`emulated`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hal.contract.errors import HalError

SCHEMA_VERSION = "1.1"      # 1.1: sustained_matmul (optional; 1.0 files read as before)


class MatmulFigure(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dtype: str
    m: int = Field(ge=1)
    n: int = Field(ge=1)
    k: int = Field(ge=1)
    flops_per_s: float = Field(gt=0, description="2 m n k / median seconds")
    seconds_median: float = Field(gt=0)
    repeats: int = Field(ge=1)
    fraction_of_peak: Optional[float] = Field(
        default=None, ge=0, description="flops_per_s / the profile's peak (None: unknown or emulated)")


class BandwidthFigure(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["device_copy"] = "device_copy"
    bytes: int = Field(ge=1, description="size of the copied tensor")
    bytes_per_s: float = Field(gt=0, description="bytes read + bytes written / median seconds")
    seconds_median: float = Field(gt=0)
    repeats: int = Field(ge=1)
    fraction_of_peak: Optional[float] = Field(default=None, ge=0)


class SustainedFigure(BaseModel):
    """A matmul run back to back for `duration_s`: its short-run rate (the fastest of the first rounds) against
    the rate it keeps (the median of the second half of the rounds), e.g. once a power cap engages."""
    model_config = ConfigDict(extra="forbid")

    dtype: str
    m: int = Field(ge=1, description="square shape m = n = k")
    duration_s: float = Field(gt=0)
    rounds: int = Field(ge=2)
    seconds_short: float = Field(gt=0, description="one round's seconds at the start (fastest of the first 3)")
    seconds_sustained: float = Field(gt=0, description="median round seconds over the second half of the run")
    sustained: float = Field(gt=0, le=1, description="min(1, seconds_short / seconds_sustained)")


class CollectiveFigure(BaseModel):
    model_config = ConfigDict(extra="forbid")

    collective: Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"]
    dtype: str
    bytes: int = Field(ge=1, description="nccl-tests size: the per-rank buffer (all_gather: the gathered total)")
    world_size: int = Field(ge=1)
    seconds_median: float = Field(gt=0, description="median over repeats of the slowest rank's time")
    algbw: float = Field(gt=0, description="bytes / seconds")
    busbw: float = Field(gt=0, description="algbw x the nccl-tests factor for the collective")
    repeats: int = Field(ge=1)


class EfficiencyMatrix(BaseModel):
    """Measured figures for one chip under one plugin."""

    model_config = ConfigDict(extra="forbid")

    schema_version: str = SCHEMA_VERSION
    chip: str
    plugin: str
    plugin_version: Optional[str] = None
    profile_model: str
    emulated: bool
    device: str
    ccl: str = Field(description="the group the collective figures were measured on, e.g. 'ProcessGroupGloo'")
    torch_version: str
    host: str
    measured_at: str = Field(description="UTC time, ISO 8601")
    matmul: list[MatmulFigure] = Field(default_factory=list)
    memory_bandwidth: list[BandwidthFigure] = Field(default_factory=list)
    collectives: list[CollectiveFigure] = Field(default_factory=list)
    # native accelerators only (an emulated chip's host says nothing of the chip's power cap)
    sustained_matmul: Optional[SustainedFigure] = None
    notes: str = ""

    @field_validator("schema_version")
    @classmethod
    def _known_major(cls, v: str) -> str:
        if v.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
            raise ValueError(f"efficiency matrix schema {v}; this reader understands {SCHEMA_VERSION.split('.')[0]}.x")
        return v

    # ---- what a planner asks ----------------------------------------------------------------
    def best_matmul_flops(self, dtype: str) -> Optional[float]:
        """Highest achieved matmul FLOP/s for `dtype` (over the measured shapes), or None."""
        vals = [f.flops_per_s for f in self.matmul if f.dtype == dtype]
        return max(vals) if vals else None

    def memory_bytes_per_s(self) -> Optional[float]:
        vals = [f.bytes_per_s for f in self.memory_bandwidth]
        return max(vals) if vals else None

    def busbw(self, collective: str, nbytes: int) -> Optional[float]:
        """Bus bandwidth of `collective` at `nbytes`, interpolated (log-size) between measured sizes
        and clamped at the ends; None if the collective was not measured."""
        import math
        pts = sorted((f.bytes, f.busbw) for f in self.collectives if f.collective == collective)
        if not pts:
            return None
        if nbytes <= pts[0][0]:
            return pts[0][1]
        if nbytes >= pts[-1][0]:
            return pts[-1][1]
        for (b0, v0), (b1, v1) in zip(pts, pts[1:]):
            if b0 <= nbytes <= b1:
                w = (math.log(nbytes) - math.log(b0)) / (math.log(b1) - math.log(b0))
                return v0 + w * (v1 - v0)
        return pts[-1][1]

    def write(self, path: str | Path) -> None:
        Path(path).write_text(self.model_dump_json(indent=2) + "\n")


def load_efficiency_matrix(path: str | Path) -> EfficiencyMatrix:
    """Read and validate a matrix written by `hal conformance --level perf --efficiency FILE`."""
    return EfficiencyMatrix.model_validate(json.loads(Path(path).read_text()))


# nccl-tests' bus bandwidth factors (doc/PERFORMANCE.md): busbw = algbw x factor(n) on n ranks, so a
# figure compares directly with a link's bandwidth whatever the collective. The one definition in the
# project: the conformance perf level, `hal bench comm` and benchmarks/ all read it.
BUSBW_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}


class UnknownCollectiveError(HalError, ValueError):
    """A bus-bandwidth factor asked for a collective nccl-tests defines none for."""


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw for collective `op` on `n` ranks (n >= 1)."""
    if op not in BUSBW_FACTOR:
        raise UnknownCollectiveError(f"busbw_factor: unknown op {op!r}; expected one of {sorted(BUSBW_FACTOR)}")
    if n < 1:
        raise UnknownCollectiveError(f"busbw_factor({op!r}, n={n}): n is the group size, at least 1")
    return BUSBW_FACTOR[op](n)
