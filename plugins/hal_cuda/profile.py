"""CUDA chip profiles: the catalog's published figures for a known model, unknowns for any other."""
from __future__ import annotations

from typing import Optional

import hal


def chip_profile(chip: str, model: Optional[str]) -> hal.ChipProfile:
    """`model` None: the catalog's default; a catalog key or a device name (`NVIDIA H100 80GB HBM3`):
    the matching catalog profile; anything else: a profile of unknowns, measured later."""
    from hal import catalog  # imported here so that importing the plugin stays cheap
    if model is None:
        return catalog.default(chip)
    try:
        return catalog.get(chip, model)  # a key or alias, else the catalog's `match` patterns
    except LookupError:  # catalog.UnknownModelError
        return unknown_profile(chip, model)


def unknown_profile(chip: str, model: str, notes: str = "") -> hal.ChipProfile:
    """Every figure unknown (never invented); the conformance perf level measures them."""
    why = f"unknown model {model!r}: not in the HAL catalog; figures are measured later by the perf level"
    return hal.ChipProfile(
        chip=chip, model=model,
        peak_flops={d: hal.unknown("FLOP/s", why) for d in ("float32", "tf32", "bfloat16", "float16")},
        memory_bytes=hal.unknown("B", why), memory_bandwidth=hal.unknown("B/s", why),
        intra_node_bandwidth=hal.unknown("B/s", why), nic_bandwidth=hal.unknown("B/s", why),
        notes=why + (f"; {notes}" if notes else ""))
