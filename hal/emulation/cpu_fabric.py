"""The CPU fabric: which one `HAL_CPU_CCL` selects, and what each measurably supports.

Below both fabrics' process groups (hal.emulation.gloo_group, hal.emulation.shm) and the code that
picks between them (hal.emulation.emulate), so each of those can ask what the fabric supports.
"""
from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from hal import envs
from hal.contract.capabilities import CapabilityMatrix
from hal.contract.errors import ChipSelectionError


def cpu_ccl() -> str:
    """The CPU fabric selected by `HAL_CPU_CCL`: auto (default: shm when all ranks of a group are on one
    host, gloo otherwise), shm or gloo; another value raises ChipSelectionError."""
    return envs.HAL_CPU_CCL.get(error=ChipSelectionError)


@lru_cache(maxsize=None)
def cpu_fabric_capabilities(backend: str = "gloo", chip: str = "cpu") -> CapabilityMatrix:
    """What the CPU fabric really supports, as measured by `python -m hal_cpu.measure_capabilities`
    (the data file records the torch version it was measured with). For `auto`, what both fabrics
    support, since the group may turn out to be either. `chip` names the matrix: a plugin whose CCL
    is gloo (`hal new-plugin`'s template with CCL_BACKEND = "gloo") declares
    `cpu_fabric_capabilities("gloo", chip="acme")`."""
    if backend == "auto":
        return cpu_fabric_capabilities("gloo", chip).intersect(
            cpu_fabric_capabilities("shm", chip), source="auto: measured gloo ∩ measured shm matrices")
    if backend not in ("gloo", "shm"):
        raise ValueError(f"cpu_fabric_capabilities: backend {backend!r} is not a CPU fabric; expected "
                         f"'gloo', 'shm' or 'auto'")
    name = f"{backend}_capabilities.json"
    data = json.loads((resources.files("hal") / "data" / name).read_text())
    return CapabilityMatrix(chip=chip, entries=frozenset(tuple(e) for e in data["entries"]),
                            source=data["source"])
