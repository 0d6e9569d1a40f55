"""Is this process on an NVIDIA GPU? Tells NVIDIA from the other builds that also say `cuda`.

Three kinds of torch build show devices as torch `cuda`: NVIDIA's (CUDA), AMD's (ROCm/HIP) and
KunlunXin's (a CUDA-compatible build recognised by `torch_xmlir` being installed; see hal_kunlun).
Only the first is this plugin's chip.

The probe is fork-safe: it never calls `torch.cuda.is_available()`, whose `cudaGetDeviceCount` runs
`cuInit` and makes every later `fork()`ed child unable to use CUDA (torch/cuda/__init__.py v2.13.0:
"This function will NOT poison fork if PYTORCH_NVML_BASED_CUDA_CHECK=1"). It counts devices with
`torch.cuda.device_count()` (public), which asks NVML while CUDA is not initialised (and honours
CUDA_VISIBLE_DEVICES); only when NVML itself fails does torch fall back to `cudaGetDeviceCount`
(torch/cuda/__init__.py v2.13.0 `device_count`). No public torch API says which of the two answered
(`torch.cuda._device_count_nvml` is private), so the probe does not claim to know: `count_source`
states the rule instead. Device names are read only at bind time, after the device was selected.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any

import torch

from hal import sdk

KUNLUN_ADAPTER = "torch_xmlir"


def probe() -> dict[str, Any]:
    """What this process sees, and whether `cuda` is natively usable (`native`) with the reason."""
    found: dict[str, Any] = {
        "torch_cuda_version": torch.version.cuda,
        "torch_hip_version": getattr(torch.version, "hip", None),
        "kunlun_adapter_installed": _installed(KUNLUN_ADAPTER),
        "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    too_old = sdk.torch_problem("hal_cuda (ProcessGroupNCCL options and FSDP2 as of torch 2.5)", sdk.TORCH_FLOOR)
    if too_old:
        return {**found, "native": False, "reason": too_old}
    if found["torch_cuda_version"] is None:
        return {**found, "native": False, "reason": f"torch {torch.__version__} was built without CUDA (a CPU "
                                                    f"build): install a CUDA build of torch for NVIDIA GPUs"}
    if found["torch_hip_version"]:
        return {**found, "native": False, "reason": "torch is a ROCm (HIP) build: AMD GPUs, not this chip"}
    if found["kunlun_adapter_installed"]:
        return {**found, "native": False,
                "reason": f"{KUNLUN_ADAPTER} is installed: torch `cuda` devices are KunlunXin XPUs (chip kunlun)"}
    try:
        count = torch.cuda.device_count()  # NVML-based before CUDA is initialised (no cuInit)
    except Exception as exc:  # a broken driver must read as "absent", not crash the probe
        return {**found, "native": False, "reason": f"torch.cuda failed: {type(exc).__name__}: {exc}"}
    found["device_count"] = count
    found["count_source"] = ("torch.cuda.device_count(): NVML while CUDA is uninitialised, cudaGetDeviceCount "
                             "(which poisons fork) only where NVML fails; no public API says which answered")
    if count < 1:
        return {**found, "native": False, "reason": "no CUDA device visible"}
    return {**found, "native": True, "reason": f"{count} NVIDIA GPU(s) visible"}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
