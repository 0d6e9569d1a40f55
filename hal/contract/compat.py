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
- `dist.ReduceOp.PREMUL_SUM(factor)` is not callable in 2.5 and a PREMUL_SUM op has no `.factor`
  there (`premul_sum`, `premul_factor`: `dist._make_nccl_premul_sum` and the op's pickled state).
- `dist.Backend.register_backend` asserts on a name it already knows in 2.5 (a second registration,
  or `nccl`, built in); 2.13 re-registers, and never takes a device type another backend serves
  (`register_backend` gives 2.13's behaviour on both).
- `torch.rms_norm` on 2.5 squares and averages 16-bit inputs in their own dtype (float16 overflows
  from |x| ~ 256; measured), where 2.13 accumulates in float32 (`rms_norm_accumulates_wide`).
- ProcessGroupGloo on 2.5 lacks list `reduce_scatter` and `alltoall`, AVG, and every reduce op but
  SUM in `_reduce_scatter_base` (measured: `gloo_measured_file`). The HAL's gloo group
  (hal.emulation.gloo_group) runs those through fallbacks (hal.emulation.gloo_fallback) chosen by the
  matrix measured on the installed torch, so what hal/data/gloo_capabilities.json declares holds on
  every supported torch.

Nothing here imports torch at module import (`hal.sdk` promises that); every function imports it
when called. `torch_problem(...)` is what a plugin calls to refuse, with one line, a torch its
vendor stack does not support.
"""
from __future__ import annotations

import re
from functools import lru_cache
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


def premul_sum(factor: Any) -> Any:
    """`ReduceOp.PREMUL_SUM(factor)` (a float or a 1-element tensor): callable from torch 2.6; on 2.5
    through `dist._make_nccl_premul_sum`, the function 2.5's own FSDP2 uses."""
    import torch.distributed as dist
    make = dist.ReduceOp.PREMUL_SUM
    return make(factor) if callable(make) else dist._make_nccl_premul_sum(factor)


def premul_factor(op: Any) -> Any:
    """The factor of a PREMUL_SUM `ReduceOp` (float or tensor), or None (another op, or none given):
    `.factor` where torch exposes it (2.6+), else the op's pickled state (op, factor) as in 2.5."""
    import torch.distributed as dist
    if getattr(op, "op", op) != dist.ReduceOp.PREMUL_SUM:
        return None  # 2.13's .factor raises on any other op
    factor = getattr(op, "factor", None)
    if factor is None and hasattr(op, "__getstate__"):
        state = op.__getstate__()
        if isinstance(state, tuple) and len(state) == 2:
            factor = state[1]
    return factor


def register_backend(name: str, func: Any, extended_api: bool = False, devices: Optional[list] = None) -> None:
    """`dist.Backend.register_backend` with torch 2.13's semantics on every supported torch: a name it
    already knows (registered before, or built in like `nccl`) is registered again instead of failing
    2.5's assertion, and a device type another backend already serves keeps that backend (2.5 gave
    every listed device type other than cpu and cuda to the newcomer)."""
    import torch.distributed as dist
    backend = dist.Backend
    before = dict(backend.default_device_backend_map)
    try:
        backend.register_backend(name, func, extended_api=extended_api, devices=devices)
    except AssertionError:  # torch < 2.6: "... c10d backend (creator function) already exist"
        backend._plugins.pop(name.upper(), None)
        known = getattr(backend, name.upper(), None)
        if known is not None:
            delattr(backend, name.upper())  # set again to name.lower() by register_backend
        try:
            backend.register_backend(name, func, extended_api=extended_api, devices=devices)
        except BaseException:
            if known is not None and not hasattr(backend, name.upper()):
                setattr(backend, name.upper(), known)
            raise
        while backend.backend_list.count(name.lower()) > 1:
            backend.backend_list.remove(name.lower())
    for device, owner in before.items():
        if owner != "fake":
            backend.default_device_backend_map[device] = owner


@lru_cache(maxsize=1)
def rms_norm_accumulates_wide() -> bool:
    """Whether this torch's `torch.rms_norm` accumulates float16 in a wider type: asked once, of torch
    itself, on [300.0] * 4 (its squares overflow float16; the true result is 1.0)."""
    import torch
    x = torch.full((1, 4), 300.0, dtype=torch.float16)
    return bool(torch.nn.functional.rms_norm(x, (4,), None, 1e-6).eq(1.0).all())


# ProcessGroupGloo's support, measured per torch by `python -m hal_cpu.measure_capabilities --backend
# gloo` (newest first): (torch it was measured on, file in hal/data).
GLOO_MEASURED = (((2, 13), "gloo_capabilities.json"), ((2, 5), "gloo_capabilities_torch2.5.json"))


def gloo_measured_file(version: Optional[str] = None) -> str:
    """The hal/data file holding what this torch's own ProcessGroupGloo supports: the one measured on
    the newest torch not newer than it (a torch between two measurements gets the older one, so a
    combination is only called native where it was seen to work on a torch at least as old)."""
    import torch
    have = parse_version(version or torch.__version__)[:2]
    for measured, name in GLOO_MEASURED:
        if have >= measured:
            return name
    return GLOO_MEASURED[-1][1]


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
