"""Is this process on an Ascend NPU? torch_npu importable and `torch.npu.device_count() > 0`.

Importing torch_npu registers the `npu` device (PrivateUse1, `torch.npu`, backend `hccl`) and raises
when another accelerator already owns the process ("Two accelerators cannot be used at the same
time": torch_npu/__init__.py `_check_device_conflict`), so the import is tried only when the package
is installed and any failure reads as "not available" (a probe never raises).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Any

import torch

from hal import sdk

ADAPTER = "torch_npu"


def probe() -> dict[str, Any]:
    found: dict[str, Any] = {"adapter": ADAPTER, "visible_devices": os.environ.get("ASCEND_RT_VISIBLE_DEVICES")}
    try:
        installed = importlib.util.find_spec(ADAPTER) is not None
    except (ImportError, ValueError):
        installed = False
    if not installed:
        return {**found, "native": False, "reason": f"{ADAPTER} is not installed"}
    try:
        module = importlib.import_module(ADAPTER)
    except Exception as exc:
        return {**found, "native": False, "reason": f"import {ADAPTER} failed: {type(exc).__name__}: {exc}"}
    found["adapter_version"] = getattr(module, "__version__", None)
    mismatch = torch_pairing_problem(str(found["adapter_version"]), torch.__version__)
    if mismatch:
        return {**found, "native": False, "reason": mismatch}
    npu = getattr(torch, "npu", None)
    if npu is None:
        return {**found, "native": False, "reason": f"{ADAPTER} imported but torch.npu is missing"}
    try:
        count = int(npu.device_count())
    except Exception as exc:
        return {**found, "native": False, "reason": f"torch.npu.device_count() failed: {type(exc).__name__}: {exc}"}
    found["device_count"] = count
    if count < 1:
        return {**found, "native": False, "reason": "torch.npu.device_count() is 0"}
    return {**found, "native": True, "reason": f"{count} Ascend NPU(s) visible"}


def torch_pairing_problem(npu_version: str, torch_version: str) -> str | None:
    """torch_npu is built for exactly one torch: its version is that torch's (2.5.1 for torch 2.5.1,
    with .postN / rcN suffixes; Ascend/pytorch README, "Ascend Auxiliary Software" version table).
    A pair that differs, or a torch below the HAL's floor, is refused with one line; None when fine."""
    floor = sdk.torch_problem("hal_ascend", sdk.TORCH_FLOOR, version=torch_version)
    if floor:
        return floor
    try:
        built_for = sdk.parse_version(npu_version)
    except ValueError:
        return None  # a build without a readable version: nothing to compare (recorded in adapter_version)
    if built_for != sdk.parse_version(torch_version):
        return (f"torch_npu {npu_version} is built for torch {'.'.join(map(str, built_for))}, but torch is "
                f"{torch_version}: install the matching pair (Ascend/pytorch README's version table)")
    return None
