"""What an op costs on a timed-emulated chip (hal.emulation.timed): the chip's speeds, the one formula, and
an op's FLOPs and bytes.

    cost(op) = max(flops(op) / F, bytes(op) / B)        F, B = chip_speeds(chip, dtype, scale)

A planner predicting an emulated run prices work with `chip_speeds` and `op_cost` (or a recorded op
trace with `hal.emulation.timed.record_ops` + `trace_cost`); hal.emulation.timed's clock charges with the same. The
approximations (FLOPs of matmul-like ops only, bytes = inputs + outputs) are stated in hal.emulation.timed.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional, Union

import torch

from hal import envs
from hal.contract.chips import DTYPE_KEYS, ChipProfile
from hal.contract.errors import HalError

# Achieved fraction of the catalog peak FLOP/s when no efficiency matrix is given: large dense
# transformer runs report 0.4-0.55 model FLOPs utilisation on H100/A100 (Megatron-LM, torchtitan);
# the planner's DEFAULT_MFU is this figure (hal/strategies/planner/facts.py imports it).
DEFAULT_EFFICIENCY = 0.45
# Memory bandwidth is charged at the catalog's figure (no efficiency factor, as the planner does).
# Figures the catalog lists as unknown: chip model -> figure -> (value, why). The one definition
# (hal/strategies/planner/facts.py imports it).
ASSUMED: dict[str, dict[str, tuple[float, str]]] = {
    "P800": {
        "peak_bf16": (345e12, "assumed: the '345 TFLOPS FP16' figure of industry analyses "
                              "(the catalog notes it has no vendor datasheet)"),
        "memory_bw": (2.0e12, "assumed: HBM-class module, about 910B2's"),
    },
    "910B2": {
        "memory_bw": (1.6e12, "assumed: HBM2e, 1.6 TB/s class (no figure in the catalog)"),
    },
}
DEFAULT_MEMORY_BW = (1.5e12, "default: 1.5 TB/s")
DEFAULT_DTYPE = envs.HAL_EMULATE_TIMED_DTYPE.default


class TimedEmulationError(HalError, ValueError):
    """Timed emulation was asked for in a way it cannot run: names the variable/argument and value."""

class Speeds(NamedTuple):
    """What the virtual clock charges at: FLOP/s and bytes/s (already divided by the scale)."""

    flops_per_s: float
    bytes_per_s: float
    source: str

# ---- the one formula for an emulated chip's speeds -------------------------------------------------
def _profile_of(chip: Union[str, ChipProfile], model: Optional[str]) -> Optional[ChipProfile]:
    if isinstance(chip, ChipProfile):
        return chip
    from hal.core import catalog
    try:
        return catalog.get(chip, model) if model else catalog.default(chip)
    except HalError:  # a chip the catalog lacks (cpu, a vendor's own): no profile
        return None


def _assumed(prof: Optional[ChipProfile], model: Optional[str]) -> dict[str, tuple[float, str]]:
    for key, table in ASSUMED.items():
        if (model and key.lower() == str(model).lower()) or (prof is not None and key in prof.model):
            return table
    return {}


def chip_speeds(chip: Union[str, ChipProfile], dtype: str = DEFAULT_DTYPE, scale: float = 1.0, *,
                model: Optional[str] = None, matrix: Any = None) -> Speeds:
    """(flops_per_s, bytes_per_s, source) that timed emulation charges `chip` at: the one definition
    a planner predicting an emulated run must use. `chip`: a chip name (its catalog default model,
    or `model`) or a ChipProfile; `matrix`: an `hal.core.efficiency.EfficiencyMatrix` whose measured
    figures replace the catalog's; `scale`: the time scale (1 = the real chip's speed)."""
    if dtype not in DTYPE_KEYS:
        raise TimedEmulationError(f"timed emulation dtype {dtype!r} is not one of {DTYPE_KEYS}")
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise TimedEmulationError(f"timed emulation scale {scale!r} must be a finite number > 0")
    prof = _profile_of(chip, model)
    name = prof.model if prof is not None else str(model or chip)
    assumed = _assumed(prof, model)
    flops = nbytes = None
    fsrc = bsrc = ""
    if matrix is not None and matrix.best_matmul_flops(dtype):
        flops = matrix.best_matmul_flops(dtype)
        fsrc = f"measured {dtype} matmul ({matrix.chip} {matrix.profile_model}" + \
               (", EMULATED host" if matrix.emulated else "") + ")"
    if flops is None:
        peak = prof.peak(dtype) if prof is not None else None
        if peak:
            fsrc = f"{DEFAULT_EFFICIENCY} x catalog {name} {dtype} peak {peak / 1e12:.4g} TFLOP/s"
        elif dtype == "bfloat16" and "peak_bf16" in assumed:
            peak, why = assumed["peak_bf16"]
            fsrc = f"{DEFAULT_EFFICIENCY} x {peak / 1e12:.4g} TFLOP/s ({why})"
        else:
            known = sorted(k for k, f in (prof.peak_flops.items() if prof else []) if f.value)
            raise TimedEmulationError(
                f"timed emulation of chip {name!r}: no {dtype} peak FLOP/s (catalog: unknown) and no measured "
                f"efficiency matrix; charge another dtype (HAL_EMULATE_TIMED_DTYPE, known: {known}) or give "
                f"HAL_EMULATE_TIMED_MATRIX")
        flops = DEFAULT_EFFICIENCY * peak
    if matrix is not None and matrix.memory_bytes_per_s():
        nbytes, bsrc = matrix.memory_bytes_per_s(), f"measured device copy ({matrix.chip} {matrix.profile_model})"
    elif prof is not None and prof.memory_bandwidth.value:
        nbytes, bsrc = prof.memory_bandwidth.value, f"catalog {name} memory bandwidth"
    elif "memory_bw" in assumed:
        nbytes, bsrc = assumed["memory_bw"]
    else:
        nbytes, bsrc = DEFAULT_MEMORY_BW
    source = f"{fsrc}; {bsrc} {nbytes / 1e12:.4g} TB/s; / time scale {scale:g}"
    return Speeds(flops / scale, nbytes / scale, source)


def op_cost(flops: float, nbytes: float, speeds: Speeds) -> float:
    """Seconds one op takes on the emulated chip: the slower of its compute and its memory traffic."""
    return max(flops / speeds.flops_per_s, nbytes / speeds.bytes_per_s)


def trace_cost(trace: list, speeds: Speeds) -> float:
    """Seconds the ops of a recorded trace (`VirtualClock(record=True).trace`) take at `speeds`: what
    the clock would charge a chip with those speeds for the same ops (a planner's per-layer figure)."""
    return sum(op_cost(f, b, speeds) for _, f, b in trace)


# ---- what an op costs ---------------------------------------------------------------------------
aten = torch.ops.aten
# Ops that launch no kernel on a device (views are excluded by `is_view`).
_FREE = {aten.detach.default, aten.empty.memory_format, aten.empty_strided.default, aten.new_empty.default,
         aten.new_empty_strided.default, aten.empty_like.default, aten.lift_fresh.default,
         aten.is_same_size.default, aten.size.default, aten.sym_size.int, aten.stride.default,
         aten.sym_stride.int, aten.storage_offset.default, aten.sym_storage_offset.default,
         aten.numel.default, aten.sym_numel.default, aten.dim.default, aten.is_contiguous.default,
         aten.is_contiguous.memory_format, aten.is_strides_like_format.default,
         aten.is_non_overlapping_and_dense.default}


def _flop_table() -> dict:
    from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count
    table = dict(flop_registry)
    # torch's CPU kernels for scaled_dot_product_attention, absent from flop_registry (torch 2.13
    # torch/utils/flop_counter.py lists only the CUDA/cuDNN/efficient variants). Same shapes
    # (batch, heads, seq, head_dim) as the variants it lists.
    sig = lambda t: t.shape  # noqa: E731

    def fwd(q, k, v, *a, out_val=None, **kw):
        return sdpa_flop_count(sig(q), sig(k), sig(v))

    def bwd(g, q, k, v, *a, out_val=None, **kw):
        return sdpa_backward_flop_count(sig(g), sig(q), sig(k), sig(v))
    table[aten._scaled_dot_product_flash_attention_for_cpu] = fwd
    table[aten._scaled_dot_product_flash_attention_for_cpu_backward] = bwd
    return table


_FLOPS: dict = {}


def op_flops(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """FLOPs of one aten op by torch.utils.flop_counter's formulas (0 for ops it has none for)."""
    if not _FLOPS:
        _FLOPS.update(_flop_table())
    formula = _FLOPS.get(func.overloadpacket)
    return int(formula(*args, **kwargs, out_val=out)) if formula is not None else 0


def _nbytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(y) for y in x)
    return 0


def op_bytes(args: tuple, kwargs: dict, out: Any) -> int:
    """Bytes an op moves: its tensor inputs' and outputs' nbytes (the approximation in the docstring)."""
    return _nbytes(args) + _nbytes(tuple(kwargs.values())) + _nbytes(out)
