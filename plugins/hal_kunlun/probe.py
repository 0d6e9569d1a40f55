"""Is this process on KunlunXin XPUs? Tells a Kunlun machine from an NVIDIA one, and records why.

KunlunXin's PyTorch build (xpytorch) shows its XPUs as torch `cuda` devices, with the `nccl`
backend routed to its own CCL. Public integrations recognise it by `torch_xmlir` importing:
- baidu-baige/sglang-kunlun, sglang_kunlun/platform/srt.py `activate()`: "Returns the
  fully-qualified class name ... when torch_xmlir is importable. Returns None on non-Kunlun
  machines"; sglang_kunlun/platform/device.py: device_type = "cuda".
- baidu/vLLM-Kunlun@09869ee7, vllm_kunlun/platforms/kunlun.py: device_type "cuda",
  dist_backend = "nccl"; docs/envs.py: XCCL_SO_PATH "default value is libxccl.so";
  docs/source/user_guide/configuration/env_vars.md: XPU_VISIBLE_DEVICES selects the XPUs.
So: Kunlun = torch_xmlir importable and torch.cuda sees devices. The device name is a second check,
read only after the HAL selected this rank's device (reading it initialises the runtime; the
contract forbids touching a device before selection, hal.contract.hookspecs `hal_device_runtime`):
`KunlunRuntime.device_name` refuses a selected device that calls itself 'NVIDIA ...' (and hal_cuda
never claims a device while torch_xmlir is installed).

Visible devices. Kunlun's own integrations set both variables to the same list: the XPU runtime
reads XPU_VISIBLE_DEVICES (vLLM-Kunlun@09869ee7 setup_env.sh and ci/scripts/common/env.sh), the
CUDA-compatible layer torch.cuda sees CUDA_VISIBLE_DEVICES (a public P800 training launch script sets
both "0,...,7"; PaddlePaddle/FastDeploy PR 2794 discusses both for P800). If only one is set the two
layers can number the devices differently, so before anything initialises the runtime the probe
copies the one set into the other (`sync_visible_devices`), and refuses two different lists. The
probe counts devices with torch.cuda.device_count(), never is_available() (fork safety, as hal_cuda).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Any, MutableMapping, Optional

import torch

from hal import sdk

ADAPTER = "torch_xmlir"
# The torch the KunlunXin stack is built for: 2.5.x (baidu/vLLM-Kunlun's installation docs install
# torch 2.5.1 and patch it; baidu-baige/sglang-kunlun says torch 2.5.x). Its torch_xmlir is built
# against that torch, so a process with another torch is refused natively (emulation is unaffected).
SUPPORTED_TORCH = ((2, 5), (2, 6))
TORCH_SOURCE = "baidu/vLLM-Kunlun installation docs: torch 2.5.1; baidu-baige/sglang-kunlun: torch 2.5.x"
SOURCES = ("baidu-baige/sglang-kunlun sglang_kunlun/platform/srt.py (activate: torch_xmlir importable)",
           "baidu/vLLM-Kunlun vllm_kunlun/platforms/kunlun.py (device_type cuda, dist_backend nccl)")


def probe() -> dict[str, Any]:
    """What this process sees; `native` says whether chip `kunlun` is usable, `reason` why. Touches
    no device (device_count() asks NVML-like counters, never a context)."""
    found: dict[str, Any] = {"adapter": ADAPTER, "sources": list(SOURCES),
                             "XPU_VISIBLE_DEVICES": os.environ.get("XPU_VISIBLE_DEVICES"),
                             "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}
    try:
        installed = importlib.util.find_spec(ADAPTER) is not None
    except (ImportError, ValueError):
        installed = False
    if not installed:
        return {**found, "native": False, "reason": f"{ADAPTER} is not installed (not KunlunXin's PyTorch build)"}
    wrong_torch = sdk.torch_problem("the KunlunXin stack (torch_xmlir)", *SUPPORTED_TORCH, source=TORCH_SOURCE)
    if wrong_torch:
        return {**found, "native": False, "reason": wrong_torch}
    conflict = sync_visible_devices(os.environ)
    found.update({k: os.environ.get(k) for k in VISIBLE_ENVS})
    if conflict:
        return {**found, "native": False, "reason": conflict}
    try:
        module = importlib.import_module(ADAPTER)
    except Exception as exc:
        return {**found, "native": False, "reason": f"import {ADAPTER} failed: {type(exc).__name__}: {exc}"}
    found["adapter_version"] = str(getattr(module, "__version__", "unknown"))
    try:
        count = torch.cuda.device_count()  # not is_available(): that would poison fork (see hal_cuda.probe)
    except Exception as exc:
        return {**found, "native": False, "reason": f"torch.cuda failed: {type(exc).__name__}: {exc}"}
    found["device_count"] = count
    if count < 1:
        return {**found, "native": False, "reason": f"{ADAPTER} imports but torch.cuda sees no device"}
    return {**found, "native": True, "reason": f"{ADAPTER} imports and torch.cuda sees {count} XPU(s)"}


VISIBLE_ENVS = ("XPU_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


def sync_visible_devices(env: MutableMapping[str, str]) -> Optional[str]:
    """Make XPU_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES name the same devices (copy the one that is
    set into the other). Returns a message when both are set to different lists, else None."""
    xpu, cuda = (env.get(k) for k in VISIBLE_ENVS)
    if xpu is not None and cuda is not None:
        if xpu.replace(" ", "") != cuda.replace(" ", ""):
            return (f"XPU_VISIBLE_DEVICES={xpu!r} and CUDA_VISIBLE_DEVICES={cuda!r} differ: the XPU runtime and "
                    f"torch.cuda of KunlunXin's build would number the devices differently; set both to the "
                    f"same list (or only XPU_VISIBLE_DEVICES)")
        return None
    if xpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = xpu
    elif cuda is not None:
        env["XPU_VISIBLE_DEVICES"] = cuda
    return None


def is_nvidia_name(name: str) -> bool:
    """A device that calls itself 'NVIDIA ...' is an NVIDIA GPU, whatever adapter is installed."""
    return name.strip().upper().startswith("NVIDIA")


def adapter_device_name(module: Any, index: int) -> Optional[str]:
    """torch_xmlir's own name of device `index` (`torch_xmlir.xpu.get_device_name`), None when the
    build lacks it; torch.cuda's may be generic through the CUDA-compatibility shim (e.g. 'GPU')."""
    fn = getattr(getattr(module, "xpu", None), "get_device_name", None)
    if not callable(fn):
        return None
    try:
        name = fn(index)
    except Exception:
        return None
    return str(name) if name else None
