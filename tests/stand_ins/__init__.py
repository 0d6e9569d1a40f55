"""Stand-ins for vendor PyTorch adapters we cannot run here (torch_npu, torch_xmlir) and for
torch's ProcessGroupNCCL: same names and signatures as the real ones, plain-torch CPU math where an
op computes something, and a record of every call so tests can check what the plugins asked for.

Put this folder on sys.path (`activate()`) and `import torch_npu` / `import torch_xmlir` load the
stand-ins. torch_npu's stand-in renames torch's PrivateUse1 backend to `npu` at import, as the real
one does, which cannot be undone: import it only in a throwaway process (tests use a WorkerPool).
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

PATH = str(Path(__file__).resolve().parent)


# Helpers the vendor stand-ins import by top-level name; they are this package's modules, aliased,
# so that tests (which import them as `tests.stand_ins.X`) and the stand-ins share one module
# (one FakeProcessGroupNCCL class, one CREATED list).
_SHARED = ("_fixed", "_stand_in_recorder", "_stand_in_streams", "_stand_in_nccl")


def activate() -> None:
    """Make the stand-ins importable under the vendors' module names (idempotent)."""
    if PATH not in sys.path:
        sys.path.insert(0, PATH)
    for name in _SHARED:
        sys.modules.setdefault(name, importlib.import_module(f"{__name__}.{name}"))


def deactivate() -> None:
    """Undo `activate()` and forget imported stand-ins that have no process-wide side effects."""
    xmlir = sys.modules.get("torch_xmlir")
    if xmlir is not None and hasattr(xmlir, "_undo"):
        xmlir._undo()  # the stand-in swapped torch's ProcessGroupNCCL and registered a creator
    while PATH in sys.path:
        sys.path.remove(PATH)
    for name in [m for m in sys.modules if m == "torch_xmlir" or m.startswith("torch_xmlir.")]:
        del sys.modules[name]
