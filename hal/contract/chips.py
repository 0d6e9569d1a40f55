"""What a chip is (`ChipSpec`) and what it can do on paper (`ChipProfile`, every figure sourced)."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class ChipSpec(BaseModel):
    """A chip kind, as the plugin that provides it declares it (hook `hal_chips`).

    The chip name is ours (`cuda`, `ascend`, `kunlun`, `cpu`); the torch device type and the CCL
    backend are torch's names and are recorded separately because they differ: a Kunlun build of
    PyTorch shows its devices as torch `cuda` with backend `nccl` routed to XCCL.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="chip name, unique across plugins")
    vendor: str = Field(description="who makes the chip, e.g. 'NVIDIA'")
    torch_device_type: str = Field(description="torch device type of native tensors, e.g. 'npu'")
    ccl_backend: str = Field(description="torch.distributed backend name of the vendor CCL, e.g. 'hccl'")
    ccl_name: str = Field(default="", description="the vendor's name for its CCL, e.g. 'HCCL', 'XCCL'")
    visible_devices_env: Optional[str] = Field(
        default=None, description="environment variable that restricts visible devices, if any")
    description: str = ""


FigureUnit = Literal["FLOP/s", "B", "B/s"]


class Figure(BaseModel):
    """One number on a profile, with where it comes from. `value=None` means unknown (never invented)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    value: Optional[float] = Field(default=None, ge=0)
    unit: FigureUnit
    source: Optional[str] = Field(default=None, description="public source: URL or document and page")
    note: str = ""

    @model_validator(mode="after")
    def _sourced(self) -> "Figure":
        if self.value is not None and not (self.source and self.source.strip()):
            raise ValueError(f"figure {self.value} {self.unit} has no source; give one or set value=None")
        return self

    @property
    def known(self) -> bool:
        return self.value is not None


def unknown(unit: FigureUnit, note: str = "no public source found") -> Figure:
    return Figure(value=None, unit=unit, note=note)


DTYPE_KEYS = ("float64", "float32", "tf32", "bfloat16", "float16", "float8", "int8")


class ChipProfile(BaseModel):
    """A chip model's published figures: peak dense FLOP/s per dtype, memory, links.

    Figures are per device (one GPU / one NPU die package as the vendor sells it). Dense, not
    sparse. Where the vendor publishes nothing, the figure is `unknown`, not guessed.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    chip: str = Field(description="chip name this profile belongs to, e.g. 'cuda'")
    model: str = Field(description="product model, e.g. 'H100 SXM5 80GB'")
    peak_flops: dict[str, Figure] = Field(description="dense peak FLOP/s by dtype key")
    memory_bytes: Figure
    memory_bandwidth: Figure
    intra_node_bandwidth: Figure = Field(description="per-device intra-node link bandwidth (NVLink, HCCS)")
    nic_bandwidth: Figure = Field(description="per-device network bandwidth to other nodes")
    notes: str = ""

    @field_validator("peak_flops")
    @classmethod
    def _dtype_keys(cls, v: dict[str, Figure]) -> dict[str, Figure]:
        for k, fig in v.items():
            if k not in DTYPE_KEYS:
                raise ValueError(f"peak_flops key {k!r} is not one of {DTYPE_KEYS}")
            if fig.unit != "FLOP/s":
                raise ValueError(f"peak_flops[{k!r}] has unit {fig.unit!r}, expected 'FLOP/s'")
        return v

    @model_validator(mode="after")
    def _units(self) -> "ChipProfile":
        for name, want in (("memory_bytes", "B"), ("memory_bandwidth", "B/s"),
                           ("intra_node_bandwidth", "B/s"), ("nic_bandwidth", "B/s")):
            got = getattr(self, name).unit
            if got != want:
                raise ValueError(f"{name} has unit {got!r}, expected {want!r}")
        return self

    def peak(self, dtype: str) -> Optional[float]:
        """Peak FLOP/s for a dtype key, or None if unknown."""
        fig = self.peak_flops.get(dtype)
        return fig.value if fig is not None else None
