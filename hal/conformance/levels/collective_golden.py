"""Inputs, golden results and the verdict for collectives.

Every rank can compute every other rank's input (deterministic in rank, dtype, size and a tag), so
each rank computes the golden locally in float64 / int64 / bool and no extra communication is
needed. Verdicts:

- integers, and every non-reducing collective (broadcast, all_gather, all_to_all, gather, scatter,
  send/recv) and max/min: **bit-exact** (the bytes must be equal); bool by value (gloo's sum stores
  True as the byte 2, which torch reads as True);
- float sum / avg / premul_sum / product: within the worst-case rounding bound of any summation
  order (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., section 4.2), with
  u = unit roundoff of the dtype, n = ranks, S = sum of |x_i| over ranks (elementwise):

      sum          |got - exact| <= 2 (n - 1) u S
      avg          |got - exact| <= 2 (n + 1) u S / n + u |exact|    (divide first or last)
      premul_sum   |got - exact| <= 2 (n + 1) u f S                   (factor f)
      product      |got - exact| <= 2 n u |exact|

  plus n x the dtype's smallest normal for flushed subnormals. The factor 2 is slack for a CCL
  that rounds once more than the bound counts (e.g. a cast to a wider wire type and back); a
  wrong result (a sum done in the wrong dtype, AVG computed as SUM, data from the wrong rank) is
  off by far more than that.

Inputs span each dtype's whole value range (see `_value_class`): negatives, values near the maximum
and minimum, subnormals, +-inf / NaN / -0.0 where the op moves data, and integers over their full
range so that sums and products overflow. Integer results wrap exactly as torch's CPU ops do: the
golden is computed in int64 (itself wrapping) and cast, keeping the low bits (two's complement).
Integer avg truncates toward zero (C division, as NCCL's sum-then-divide does) and draws from a
sixteenth of the range, since an overflowing average has no portable answer.
"""
from __future__ import annotations

import math
import zlib
from functools import lru_cache
from typing import Optional

import torch

from hal.contract.capabilities import torch_dtype

FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64", "float8_e4m3fn", "float8_e5m2")
INT_DTYPES = ("int8", "uint8", "int16", "int32", "int64")
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + ("bool",)

FLOAT_OPS = ("sum", "avg", "max", "min", "product", "premul_sum")
INT_OPS = ("sum", "avg", "max", "min", "product", "premul_sum", "band", "bor", "bxor")
BOOL_OPS = ("sum", "max", "min", "product", "band", "bor", "bxor")
PREMUL_FACTOR = 2.0

# u = 2^-p, p = significand bits including the implicit one.
UNIT_ROUNDOFF = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8,
                 "float8_e4m3fn": 2.0 ** -4, "float8_e5m2": 2.0 ** -3}


def meaningful_ops(dtype: str) -> tuple[str, ...]:
    """Reduce ops with a defined result for `dtype` (bitwise ops on floats, avg of bools: none)."""
    if dtype == "bool":
        return BOOL_OPS
    return FLOAT_OPS if dtype in FLOAT_DTYPES else INT_OPS


tdtype = torch_dtype  # hal's dtype name table (hal.contract.capabilities)


def _value_class(dtype: str, op: Optional[str]) -> str:
    """Which part of the dtype's value range a case draws from (every class spans negatives, large
    and tiny magnitudes; each keeps the golden well defined for its op):

    - integers: the **full** range, extremes included, for every op but avg, so sums and products
      overflow and must wrap (two's complement, as torch's CPU ops do); avg draws from a sixteenth
      of the range (an overflowing average has no portable answer: NCCL sums in the dtype first);
    - float sums (sum, avg, premul_sum): normal values, large ones up to max/256 (no partial sum of
      up to 128 ranks overflows, whatever the order), tiny normals and subnormals;
    - float products: signed powers of two spread over 1/16 of the exponent range (16 factors neither
      overflow nor underflow);
    - float max/min: the above plus +-max, +-inf where the dtype has it (no zeros, whose sign max/min
      may pick either way, and no NaN);
    - data movement: everything, with NaN, -0.0 and 0.0 too (compared byte for byte)."""
    if dtype == "bool":
        return "any"
    if dtype in INT_DTYPES:
        return "int_avg" if op == "avg" else "int_full"
    if op in ("sum", "avg", "premul_sum"):
        return "sum"
    if op == "product":
        return "product"
    if op in ("max", "min"):
        return "order"
    return "move"


def _float_values(g: torch.Generator, dtype: str, n: int, kind: str) -> torch.Tensor:
    """`n` values of floating `dtype` from the class `kind` (see `_value_class`), deterministic in `g`."""
    td = tdtype(dtype)
    fi = torch.finfo(td)
    has_inf = dtype != "float8_e4m3fn"  # e4m3fn has no infinity (overflow is NaN)
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    if kind == "product":
        e = max(1.0, math.floor(math.log2(fi.max) / 16))
        x = sign * torch.exp2((torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1) * e)
        return x.to(td)
    x = torch.randn(n, generator=g, dtype=torch.float64)
    u = torch.rand(n, generator=g, dtype=torch.float64)
    pick = torch.rand(n, generator=g)
    large = sign * (0.5 + 0.5 * u) * (fi.max / 256)
    tiny = sign * (0.3 + 0.7 * u) * fi.tiny      # subnormals and the smallest normals
    x = torch.where(pick < 0.1, large, torch.where(pick < 0.2, tiny, x))
    if kind in ("order", "move"):
        extreme = sign * fi.max
        x = torch.where((pick >= 0.2) & (pick < 0.25), extreme, x)
        if has_inf:
            x = torch.where((pick >= 0.25) & (pick < 0.28), sign * math.inf, x)
    if kind == "move" and n:  # set in float64 (exact; torch 2.5 cannot index float8 on CPU), then cast
        specials = torch.tensor([math.nan, -0.0, 0.0], dtype=torch.float64)
        idx = torch.arange(0, n, 5)[: n]  # every fifth element cycles through NaN, -0.0, 0.0
        x[idx] = specials[torch.arange(idx.numel()) % 3]
    out = x.to(td)
    if kind == "order":
        # No zeros: max(+0, -0) may return either; a zero from rounding becomes the smallest subnormal.
        # (in float64, exact for every dtype here: torch 2.5 has no `where` for float8 on CPU)
        wide = out.to(torch.float64)
        out = torch.where(wide == 0, torch.tensor(fi.tiny * 0.5, dtype=torch.float64).to(td).to(torch.float64),
                          wide).to(td)
    return out


def _int_values(g: torch.Generator, dtype: str, n: int, kind: str) -> torch.Tensor:
    info = torch.iinfo(tdtype(dtype))
    lo, hi = info.min, info.max
    if kind == "int_avg":
        lo, hi = lo // 16, hi // 16
    x = torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64).to(tdtype(dtype))
    if kind == "int_full" and n:
        x[::7] = hi   # every rank puts its extremes at the same places: sums and products overflow
        x[3::11] = lo
    return x


@lru_cache(maxsize=1024)
def _cached_input(rank: int, dtype: str, n: int, tag: str, kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(f"{tag}/{dtype}/{n}/{kind}/{rank}".encode()))
    if dtype == "bool":
        return torch.rand(n, generator=g) < 0.5
    if dtype in INT_DTYPES:
        return _int_values(g, dtype, n, kind)
    return _float_values(g, dtype, n, kind)


def make_input(rank: int, dtype: str, n: int, tag: str, op: Optional[str] = None) -> torch.Tensor:
    """Rank `rank`'s input of `n` elements (on the CPU), the same in every process; a fresh copy
    (collectives write into their inputs)."""
    return _cached_input(rank, dtype, n, tag, _value_class(dtype, op)).clone()


def _wide(t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.bool:
        return t.clone()
    return t.to(torch.float64) if t.is_floating_point() else t.to(torch.int64)


def reduce_exact(xs: list[torch.Tensor], op: str) -> torch.Tensor:
    """The exact reduction of the ranks' inputs, in float64 / int64 / bool (not yet cast)."""
    w = [_wide(x) for x in xs]
    n = len(w)
    if w[0].dtype == torch.bool:
        out = w[0]
        fold = {"sum": torch.logical_or, "max": torch.logical_or, "bor": torch.logical_or,
                "min": torch.logical_and, "product": torch.logical_and, "band": torch.logical_and,
                "bxor": torch.logical_xor}[op]
        for x in w[1:]:
            out = fold(out, x)
        return out
    is_int = not w[0].is_floating_point()
    if op in ("sum", "avg", "premul_sum"):
        out = torch.stack(w).sum(0)
        if op == "premul_sum":
            out = out * int(PREMUL_FACTOR) if is_int else out * PREMUL_FACTOR
        if op == "avg":
            out = torch.div(out, n, rounding_mode="trunc") if is_int else out / n
        return out
    if op == "product":
        out = w[0].clone()
        for x in w[1:]:
            out = out * x
        return out
    if op == "max":
        return torch.stack(w).amax(0)
    if op == "min":
        return torch.stack(w).amin(0)
    fn = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}[op]
    out = w[0]
    for x in w[1:]:
        out = fn(out, x)
    return out


def cast(exact: torch.Tensor, dtype: str) -> torch.Tensor:
    """The exact result in `dtype` (integers wrap as the hardware's do)."""
    if dtype in INT_DTYPES and dtype != "int64":
        bits = {"int8": 8, "uint8": 8, "int16": 16, "int32": 32}[dtype]
        mod = 1 << bits
        v = exact % mod  # Python-style modulo: in [0, mod)
        if dtype != "uint8":
            v = torch.where(v >= mod // 2, v - mod, v)
        return v.to(tdtype(dtype))
    return exact.to(tdtype(dtype))


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bytes of `t` (for bit-exact comparison, -0.0 != 0.0, NaN payloads count)."""
    # clone, not .contiguous(): torch calls a one-element view with stride 2 contiguous and returns it
    # as is, and view(uint8) then refuses its stride
    t = t.detach().to("cpu").clone(memory_format=torch.contiguous_format)
    return t.view(torch.uint8) if t.numel() else t.to(torch.uint8)


def _first_diff(got: torch.Tensor, want: torch.Tensor, mask: torch.Tensor) -> str:
    idx = int(mask.nonzero()[0][0])
    return f"first at [{idx}]: got {got[idx].item()!r}, expected {want[idx].item()!r}"


def verdict_exact(got: torch.Tensor, want: torch.Tensor) -> Optional[str]:
    """None if `got` equals `want` byte for byte (and in shape and dtype); else what differs."""
    got = got.detach().to("cpu")
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, expected {want.dtype}"
    if tuple(got.shape) != tuple(want.shape):
        return f"shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    if got.dtype == torch.bool:
        # By value: some CCLs (gloo's sum) store True as a byte other than 1, which torch reads as True.
        if torch.equal(got, want):
            return None
        g, w = got.reshape(-1), want.reshape(-1)
        diff = g.ne(w)
        return f"{int(diff.sum())} of {g.numel()} elements differ; {_first_diff(g, w, diff)}"
    if torch.equal(bits(got), bits(want)):
        return None
    g, w = got.reshape(-1), want.reshape(-1)
    diff = bits(g).reshape(g.numel(), -1).ne(bits(w).reshape(w.numel(), -1)).any(-1)
    return f"{int(diff.sum())} of {g.numel()} elements differ (bit-exact expected); {_first_diff(g, w, diff)}"


def verdict_reduce(got: torch.Tensor, xs: list[torch.Tensor], op: str, dtype: str) -> Optional[str]:
    """None if a reduction result is right (bit-exact or within the bound in the docstring)."""
    exact = reduce_exact(xs, op)
    if dtype not in FLOAT_DTYPES or op in ("max", "min"):
        return verdict_exact(got, cast(exact, dtype))
    got = got.detach().to("cpu")
    if got.dtype != tdtype(dtype) or tuple(got.shape) != tuple(exact.shape):
        return f"dtype/shape {got.dtype}{tuple(got.shape)}, expected {tdtype(dtype)}{tuple(exact.shape)}"
    n, u = len(xs), UNIT_ROUNDOFF[dtype]
    tiny = torch.finfo(tdtype(dtype)).tiny
    S = torch.stack([x.to(torch.float64).abs() for x in xs]).sum(0)
    if op == "sum":
        bound = 2 * (n - 1) * u * S
    elif op == "avg":
        bound = 2 * (n + 1) * u * S / n + u * exact.abs()
    elif op == "premul_sum":
        bound = 2 * (n + 1) * u * PREMUL_FACTOR * S
    else:  # product
        bound = 2 * n * u * exact.abs()
    bound = bound + n * tiny
    g = got.to(torch.float64)
    err = (g - exact).abs()
    bad = ~(err <= bound)  # NaN counts as bad
    if not bad.any():
        return None
    idx = int(bad.nonzero()[0][0])
    return (f"{int(bad.sum())} of {g.numel()} elements outside the rounding bound; first at [{idx}]: got "
            f"{g[idx].item():.6g}, exact {exact[idx].item():.6g}, allowed |err| <= {bound[idx].item():.3g} "
            f"(u={u:.3g}, n={n})")
