"""Assemble the perf level's measured figures into the chip's `EfficiencyMatrix`."""
from __future__ import annotations

import platform
import socket
from datetime import datetime, timezone

from ..checks import CheckFailed, CheckSkipped
from hal.core.efficiency import SCHEMA_VERSION, EfficiencyMatrix
from ..target import LocalContext

_SOURCES = ("perf.matmul", "perf.memory_bandwidth", "perf.collective_busbw")


def assemble(ctx: LocalContext) -> EfficiencyMatrix:
    """The matrix from the results of the perf checks that passed in this run (validated)."""
    t = ctx.target
    ran = {cid: ctx.results[cid] for cid in _SOURCES if cid in ctx.results}
    passed = {cid: r for cid, r in ran.items() if r.status == "passed" and r.data}
    if not ran:
        raise CheckSkipped("no perf measurement was selected in this run")
    if not passed:
        raise CheckFailed("no perf measurement produced figures: "
                          + "; ".join(f"{cid} {r.status}: {r.message}" for cid, r in ran.items()))
    meta: dict = {}
    fields: dict[str, list] = {"matmul": [], "memory_bandwidth": [], "collectives": []}
    sustained = None
    ccl = "not measured"
    for cid, r in passed.items():
        data = r.data
        if isinstance(data, list):  # a multi-rank check: rank 0 carries the figures
            data = next((d for d in data if d), None) or {}
        meta = data.get("meta") or meta
        ccl = data.get("ccl", ccl)
        for key in fields:
            fields[key].extend(data.get(key) or [])
        sustained = data.get("sustained_matmul") or sustained
    prof_model = meta.get("profile_model")
    if prof_model is None and t.pm is not None:
        prof_model = t.pm.profile(t.chip, None).model
    notes = ("EMULATED: figures measure the host CPU running the chip's emulation, not the chip"
             if t.emulated else "")
    try:
        matrix = EfficiencyMatrix(
            schema_version=SCHEMA_VERSION, chip=t.chip, plugin=t.plugin_name, plugin_version=t.plugin_version,
            profile_model=prof_model or "unknown", emulated=t.emulated, device=meta.get("device", "unknown"),
            ccl=ccl, torch_version=meta.get("torch_version") or _torch_version(),
            host=f"{socket.gethostname()} ({platform.processor() or platform.machine()})",
            measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), notes=notes,
            sustained_matmul=None if t.emulated else sustained, **fields)
        # Round-trip through JSON, as a planner will read it.
        return EfficiencyMatrix.model_validate_json(matrix.model_dump_json())
    except Exception as exc:
        raise CheckFailed(f"the measured figures do not validate as an EfficiencyMatrix: {exc}") from exc


def _torch_version() -> str:
    import torch
    return torch.__version__
