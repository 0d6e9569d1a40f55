"""The generic CPU profile: the host's figures are unknown ahead of time (the perf level measures)."""
from __future__ import annotations

import os
from typing import Optional

from hal import sdk


def cpu_profile(model: Optional[str] = None) -> sdk.ChipProfile:
    """A profile with every figure unknown: there is no published peak for 'a CPU'. The conformance
    perf level measures the host and writes its efficiency matrix instead."""
    name = model or _cpu_model() or "generic host CPU"
    return sdk.ChipProfile(
        chip="cpu", model=name,
        peak_flops={d: sdk.unknown("FLOP/s", "host CPUs vary; measured by the perf level")
                    for d in ("float32", "bfloat16", "float16", "float64")},
        memory_bytes=_mem_total(),
        memory_bandwidth=sdk.unknown("B/s", "host-dependent; measured by the perf level"),
        intra_node_bandwidth=sdk.unknown("B/s", "shared memory; measured by hal bench comm"),
        nic_bandwidth=sdk.unknown("B/s", "host-dependent"),
        notes="generic CPU: figures are measured, not published",
    )


def _cpu_model() -> Optional[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _mem_total() -> sdk.Figure:
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return sdk.Figure(value=float(pages * size), unit="B", source="os.sysconf(SC_PHYS_PAGES) on this host")
    except (ValueError, OSError, AttributeError):
        return sdk.unknown("B")
