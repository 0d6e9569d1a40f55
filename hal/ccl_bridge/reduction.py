"""Reduce ops and dtypes as the bridge sees them: what torch allows, what widens to what, local reduction.

The bridge never passes AVG or PREMUL_SUM to an inner group: sums of partial averages are not the
average. AVG is SUM followed by a division by the group size; PREMUL_SUM(f) multiplies the input by f
and then sums. Both are floating-point only (torch's gloo refuses AVG on integers; NCCL documents
PREMUL_SUM for floating types), so integer or bool AVG/PREMUL_SUM raise `hal.NotSupportedError`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from hal.contract.capabilities import REDUCE_OPS, TORCH_REDUCE_OPS, dtype_name
from hal.contract.compat import premul_factor
from hal.contract.errors import NotSupportedError

_OPS = {name.upper(): name for name in REDUCE_OPS}  # torch's RedOpType name -> hal's reduce-op name
# what inner groups are ever asked for: hal's table less AVG (done as SUM, then a divide)
TORCH_OP = {name: op for name, op in TORCH_REDUCE_OPS.items() if name != "avg"}
INNER_OPS = tuple(TORCH_OP)  # what inner groups are ever asked for

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INTEGERS = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)
FLOAT8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                           "float8_e5m2fnuz") if hasattr(torch, n))

# Where a reduction the CCL lacks in one dtype is done instead. Exactness: integer sums/products
# wrap modulo 2^bits in every dtype, so widening and narrowing back gives the narrow CCL's result
# bit for bit; bool SUM/MAX is OR, MIN/PRODUCT is AND, BXOR parity -- all preserved through uint8.
# Widening a 16-bit float only makes the partial sums more accurate (within the documented tolerance).
WIDER: dict[torch.dtype, tuple[torch.dtype, ...]] = {
    torch.bool: (torch.uint8, torch.int32, torch.int64),
    torch.int8: (torch.int32, torch.int64),
    torch.uint8: (torch.int32, torch.int64),
    torch.int16: (torch.int32, torch.int64),
    torch.int32: (torch.int64,),
    torch.float16: (torch.float32, torch.float64),
    torch.bfloat16: (torch.float32, torch.float64),
    torch.float32: (torch.float64,),
}


@dataclass(frozen=True)
class ReduceSpec:
    """A reduce op as the bridge runs it: the inner op, and scaling before/after."""

    name: str                          # as the user asked: sum, avg, premul_sum, ...
    inner: str                         # what inner groups run: sum/product/min/max/band/bor/bxor
    premul: Optional[float] = None     # PREMUL_SUM factor, applied to the input
    average: bool = False              # divide by the group size at the end


def reduce_spec(op, dtype: torch.dtype) -> ReduceSpec:
    """Turn torch's ReduceOp (object or RedOpType) into a `ReduceSpec`, refusing what torch refuses."""
    red = getattr(op, "op", op)  # ReduceOp object -> RedOpType
    key = getattr(red, "name", str(red).split(".")[-1]).upper()
    name = _OPS.get(key)
    if name is None:
        raise NotSupportedError(f"hetero: reduce op {key!r} is not supported")
    is_float = dtype in FLOATS
    if dtype.is_complex:
        raise NotSupportedError(f"hetero: {name} on complex dtype {dtype_name(dtype)}: torch.distributed "
                                f"passes complex tensors as real views; call it through dist.* APIs")
    if dtype in FLOAT8:
        raise NotSupportedError(f"hetero: reduce op {name} on {dtype_name(dtype)}: float8 has no reduction "
                                f"semantics in torch's CPU collectives")
    if name in ("avg", "premul_sum") and not is_float:
        raise NotSupportedError(f"hetero: reduce op {name} on {dtype_name(dtype)}: defined for floating "
                                f"dtypes only (torch's gloo refuses AVG on integers)")
    if name in ("band", "bor", "bxor") and is_float:
        raise NotSupportedError(f"hetero: bitwise reduce op {name} on {dtype_name(dtype)}: integer and "
                                f"bool dtypes only")
    if name == "avg":
        return ReduceSpec(name, "sum", average=True)
    if name == "premul_sum":
        factor = premul_factor(op)  # .factor from torch 2.6; 2.5 keeps it in the pickled state
        if isinstance(factor, torch.Tensor):
            factor = float(factor.item())
        if factor is None:
            raise NotSupportedError("hetero: PREMUL_SUM without a factor")
        return ReduceSpec(name, "sum", premul=float(factor))
    return ReduceSpec(name, name)


def local_reduce(stack: torch.Tensor, inner: str, out_dtype: torch.dtype) -> torch.Tensor:
    """Reduce `stack` (contributions along dim 0, in rank order) the way a CCL would, in a wide dtype
    so the result is exact for integers and at least as accurate as the CCL's for floats."""
    if inner in ("band", "bor", "bxor"):
        acc = stack[0].clone()
        fn = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}[inner]
        for row in stack[1:]:
            acc = fn(acc, row)
        return acc.to(out_dtype)
    if stack.dtype == torch.bool:
        wide = stack.to(torch.int64)
    elif stack.dtype in (torch.float16, torch.bfloat16):
        wide = stack.to(torch.float32)
    elif stack.dtype in INTEGERS:
        wide = stack.to(torch.int64)
    else:
        wide = stack
    if inner == "sum":
        res = wide.sum(dim=0)
    elif inner == "product":
        res = wide.prod(dim=0)
    elif inner == "max":
        res = wide.amax(dim=0)
    elif inner == "min":
        res = wide.amin(dim=0)
    else:
        raise NotSupportedError(f"hetero: local reduce of {inner!r}")
    if out_dtype == torch.bool:
        return res != 0
    return res.to(out_dtype)
