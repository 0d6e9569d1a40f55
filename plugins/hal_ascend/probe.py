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
