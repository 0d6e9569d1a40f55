"""How far an op kernel's output may be from the float64 golden: `tolerance(op, dtype) -> (rtol, atol)`.

A kernel passes when, elementwise, |out - golden| <= atol + rtol * |golden| (torch.allclose's rule),
where golden is the reference kernel run in float64 on float64 copies of the same (already rounded)
inputs. So input rounding is not counted: the budget is only for what the kernel adds.

Every figure is derived from unit roundoff, not tuned:

    u(dtype) = 2^-p, p = significand bits including the implicit one:
        float64 2^-53 (1.1e-16)   float32 2^-24 (6.0e-8)   float16 2^-11 (4.9e-4)   bfloat16 2^-8 (3.9e-3)

Rounding a result to `dtype` costs up to u relative; each further rounding in `dtype` up to u more.
16-bit kernels are expected to do their arithmetic in float32 (the accumulator; float64 for float64),
as the reference and the vendors' fused kernels do. For an op of "shape"

    rtol = out * u(dtype) + acc * g(n) * u(accumulator),   g(n) = sqrt(MAX_REDUCTION) for reductions, else 1

- `out` counts roundings in the storage dtype (the output, a weight multiply, ...), with slack for a
  kernel that does one or two of its steps in the storage dtype;
- `acc * g(n)` is the accumulator's error: summing n terms with round-to-nearest errs ~sqrt(n) u
  (the errors are independent; n u is the worst case that does not happen with random inputs), and
  transcendental functions (exp, erf, tanh, rsqrt) are accurate to a few ulp (SLEEF's u10 variants).

For 16-bit dtypes the `out` term dominates by far (sqrt(4096) u(float32) = 3.8e-6 << 2^-11): a kernel
that accumulates a 4096-long sum in float16/bfloat16 (error ~ sqrt(n) u(dtype) = 64 u, against a budget of 2-4 u) fails
on purpose. For float32 the accumulator term dominates for reductions: these tolerances hold for
reductions of up to MAX_REDUCTION elements; TF32/HF32 matmuls (10-bit mantissa, u = 2^-11) fail float32
on purpose (float32 means float32 unless the user opts in).

`atol` covers outputs near zero. The check's inputs are scaled so outputs are of order 1 (matmul's
operand by 1/sqrt(K), etc.), so where an op can cancel (a sum of terms of both signs, x - mean,
1 + erf(x) for x < 0) its absolute error is about rtol x the order-1 size of the terms: atol = rtol.
Ops that cannot cancel (softmax: positive terms only) need atol only for results below the dtype's
smallest normal number, where accelerators may flush to zero: atol = finfo(dtype).tiny.

AdamW's tolerance is per step: the parameter, m and v are rounded to the storage dtype once a step
and these errors add up, so compare k steps with k x (rtol, atol).

float64 gets the same formulas with u = 2^-53: "exact-ish", a few ulp, yet it still catches a kernel
that silently computes in float32 (error ~1e-7 against a budget ~1e-14).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

import torch

from hal.contract.errors import UnknownOpError
from hal.contract.kernel import OP_NAMES

# p = significand bits with the implicit leading one; u = 2^-p.
UNIT_ROUNDOFF: dict[str, float] = {"float64": 2.0 ** -53, "float32": 2.0 ** -24,
                                   "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
# Where the arithmetic happens: 16-bit kernels compute in float32, float64 in float64.
ACCUMULATOR: dict[str, str] = {"float64": "float64", "float32": "float32", "float16": "float32",
                               "bfloat16": "float32"}
DTYPES: tuple[str, ...] = tuple(UNIT_ROUNDOFF)
# Longest reduction (hidden size, head dim, vocabulary chunk, K of a matmul) the figures hold for.
MAX_REDUCTION = 4096


@dataclass(frozen=True)
class Rule:
    """The error model of one op; see the module docstring."""

    out: float       # multiples of u(dtype)
    acc: float       # multiples of u(accumulator), times sqrt(MAX_REDUCTION) if `reduces`
    reduces: bool    # sums over up to MAX_REDUCTION elements
    atol: str        # "rtol": can cancel; "tiny": cannot cancel, only flushed subnormals; "exact"
    why: str


RULES: dict[str, Rule] = {
    "linear": Rule(2, 2, True, "rtol",
                   "K-long dot products accumulated in float32 (sqrt(K) growth), then one rounding of the "
                   "output and one of the bias add; dot products cancel, so atol = rtol"),
    "matmul": Rule(2, 2, True, "rtol",
                   "as linear without the bias: sqrt(K) accumulation error plus the output rounding"),
    "rms_norm": Rule(4, 4, True, "rtol",
                     "mean of h squares in float32 (sqrt(h) growth), rsqrt (a few ulp), the weight multiply "
                     "and output rounding (up to 2 roundings in dtype, +2 slack)"),
    "layer_norm": Rule(4, 4, True, "rtol",
                       "mean and variance over h in float32; x - mean cancels (inputs with mean 3 check it), "
                       "so atol = rtol; weight multiply, bias add and output rounding in dtype"),
    "softmax": Rule(4, 4, True, "tiny",
                    "a sum of n positive exps in float32 (sqrt(n) growth, exp a few ulp), a division and "
                    "the output rounding; no cancellation, so only flushed subnormals need atol"),
    "scaled_dot_product_attention": Rule(4, 8, True, "rtol",
                                         "two reductions (q.k over D, p.v over Sk) and a softmax; flash-style "
                                         "kernels round p to dtype before p.v (1 rounding) and rescale the "
                                         "running sum (a few float32 roundings); p.v cancels, so atol = rtol"),
    "gelu": Rule(4, 8, False, "rtol",
                 "erf/tanh accurate to a few float32 ulp; 1 + erf(x) cancels for x < 0, turning them into "
                 "absolute error ~|x| u; output rounding plus up to 3 roundings for a kernel computing in dtype"),
    "silu": Rule(4, 8, False, "rtol",
                 "x * sigmoid(x): exp a few float32 ulp, a division, a multiply, the output rounding"),
    "swiglu": Rule(4, 8, False, "rtol",
                   "silu(a) * b: silu's error plus one multiply (relative errors add)"),
    "rotary_embedding": Rule(4, 8, False, "rtol",
                             "x cos + rotate_half(x) sin: two products and a sum that can cancel (atol = rtol); "
                             "cos/sin are inputs, so their rounding is not counted"),
    "cross_entropy": Rule(4, 4, True, "rtol",
                          "logsumexp over C classes and a mean over N rows in float32 (sqrt growth); a row's "
                          "loss lse - x_t cancels when x_t dominates, so atol = rtol; output rounding in dtype"),
    "embedding": Rule(0, 0, False, "exact", "a gather: the rows are copied bit for bit"),
    "adamw_step": Rule(4, 8, False, "rtol",
                       "per step: p, m, v each rounded to dtype once (m's update can cancel: atol = rtol), "
                       "sqrt and a division in float32; k steps: k x the tolerance"),
}
assert set(RULES) == set(OP_NAMES), f"tolerance rules missing for {set(OP_NAMES) - set(RULES)}"


def _dtype_key(dtype: Union[torch.dtype, str]) -> str:
    key = str(dtype).removeprefix("torch.")
    if key not in UNIT_ROUNDOFF:
        raise ValueError(f"no tolerance for dtype {dtype!r}; floating dtypes with tolerances: {list(DTYPES)}")
    return key


def _compute(op: str, key: str) -> tuple[float, float]:
    rule = RULES[op]
    if rule.atol == "exact":
        return 0.0, 0.0
    growth = math.sqrt(MAX_REDUCTION) if rule.reduces else 1.0
    rtol = rule.out * UNIT_ROUNDOFF[key] + rule.acc * growth * UNIT_ROUNDOFF[ACCUMULATOR[key]]
    atol = rtol if rule.atol == "rtol" else torch.finfo(getattr(torch, key)).tiny
    return rtol, atol


# (op, dtype name) -> (rtol, atol), computed once from RULES.
TOLERANCES: dict[tuple[str, str], tuple[float, float]] = {
    (op, key): _compute(op, key) for op in OP_NAMES for key in DTYPES}


def tolerance(op: str, dtype: Union[torch.dtype, str]) -> tuple[float, float]:
    """(rtol, atol) for `op` computing in `dtype` (torch.float16 or "float16"), against the float64
    golden. Raises UnknownOpError for an op the HAL does not define, ValueError for a dtype without
    a tolerance (integer dtypes: ops on them are exact)."""
    if op not in RULES:
        raise UnknownOpError(f"no tolerance for op {op!r}; HAL ops are {list(OP_NAMES)}")
    return TOLERANCES[(op, _dtype_key(dtype))]

