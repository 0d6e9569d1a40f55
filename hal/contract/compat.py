"""Torch compatibility: the one place that knows which torch APIs moved between the oldest torch we
support and the newest, so the rest of the code imports them from here.

The floor is torch 2.5: the KunlunXin stack ships torch 2.5.1 (baidu/vLLM-Kunlun's installation docs
and its torch-2.5.1 patches; baige/sglang-kunlun says 2.5.x), and Ascend's torch_npu has a 2.5.1
release (Ascend/pytorch README's version table). What moved since 2.5, checked against torch's
release notes and sources (v2.5.1 and v2.13.0 tags):

- FSDP2: `fully_shard`, `MixedPrecisionPolicy`, `FSDPModule` are public in `torch.distributed.fsdp`
  from 2.6; in 2.4-2.5 they live in `torch.distributed._composable.fsdp`.
- DTensor: public `torch.distributed.tensor` from 2.5 (`torch.distributed._tensor` before), so
  nothing to bridge at our floor; `dtensor()` still returns the module so callers do not care.
- The accelerator API (`torch.accelerator.current_accelerator()`) appeared in 2.6; before it a
  process asks torch.cuda / torch.xpu / torch.npu itself (`current_accelerator_type`).

Nothing here imports torch at module import (`hal.sdk` promises that); every function imports it
when called. `torch_problem(...)` is what a plugin calls to refuse, with one line, a torch its
vendor stack does not support.
"""
from __future__ import annotations

import re
from typing import Any, Optional

TORCH_FLOOR = (2, 5)


def parse_version(text: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a torch-style version ("2.5.1+cpu", "2.13.0a0+git1234", "2.6")."""
    m = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    if not m:
        raise ValueError(f"not a version: {text!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def torch_version() -> tuple[int, int, int]:
    import torch
    return parse_version(torch.__version__)


def torch_problem(vendor: str, minimum: tuple[int, int] = TORCH_FLOOR, below: Optional[tuple[int, int]] = None,
                  source: str = "", version: Optional[str] = None) -> Optional[str]:
    """One line saying why this torch is outside [minimum, below) for `vendor`'s stack, or None."""
    import torch
    text = version or torch.__version__
    have = parse_version(text)[:2]
    fmt = ".".join
    if have < minimum or (below is not None and have >= below):
        span = f">= {fmt(map(str, minimum))}" + (f", < {fmt(map(str, below))}" if below else "")
        return f"torch {text} is not supported by {vendor} (supported: torch {span}{'; ' + source if source else ''})"
    return None


def check_torch_floor() -> None:
    """Raise `TorchVersionError` on a torch below the floor (the HAL's own code needs 2.5's APIs)."""
    from .errors import TorchVersionError
    problem = torch_problem("the HAL", TORCH_FLOOR, source="pip install 'torch>=2.5'")
    if problem:
        raise TorchVersionError(problem)


def fsdp() -> Any:
    """The module holding FSDP2's `fully_shard`, `MixedPrecisionPolicy`, `FSDPModule`."""
    try:
        from torch.distributed import fsdp as mod
        if hasattr(mod, "fully_shard"):  # torch >= 2.6
            return mod
    except ImportError:
        pass
    from torch.distributed._composable import fsdp as old  # torch 2.4-2.5
    return old


def fully_shard(*args: Any, **kwargs: Any) -> Any:
    return fsdp().fully_shard(*args, **kwargs)


def dtensor() -> Any:
    """`torch.distributed.tensor` (DTensor, Shard, Replicate, distribute_tensor, ...)."""
    try:
        from torch.distributed import tensor as mod
        if hasattr(mod, "DTensor"):
            return mod
    except ImportError:
        pass
    from torch.distributed import _tensor as old  # torch < 2.5
    return old


def current_accelerator_type() -> Optional[str]:
    """The device type of this process's accelerator ("cuda", "npu", "xpu", ...), or None: torch's
    accelerator API where it exists (2.6+), else the device modules asked in torch's own order. Asks
    availability only (no device is initialised beyond what torch's own query does)."""
    import torch
    api = getattr(torch, "accelerator", None)
    if api is not None and hasattr(api, "current_accelerator"):
        dev = api.current_accelerator()
        return dev.type if dev is not None else None
    for name in ("cuda", "xpu", "npu", "mps"):
        mod = getattr(torch, name, None)
        try:
            if mod is not None and mod.is_available():
                return name
        except Exception:
            continue
    return None
