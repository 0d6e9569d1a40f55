"""Golden checks of HAL op kernels: small input cases per op, the float64 golden, the comparison.

The golden of a case is the reference kernel (`hal.ops.reference`) run on float64 copies of the
case's inputs (the inputs are first made in the dtype under test, so rounding the inputs is not
counted as kernel error). A kernel's output in dtype d passes when, elementwise,

    |out - golden| <= atol + rtol * |golden|,   (rtol, atol) = tolerances.tolerance(op, d)

and it has the golden's shape and the input's dtype; a NaN or Inf where the golden is finite fails.
Used by `tests/test_ops.py` and `hal ops-check`; a conformance suite can use it unchanged.

Inputs are scaled so that outputs are of order 1 (e.g. matmul's right operand by 1/sqrt(K)): the
tolerance table assumes that (see tolerances.py). Cases cover odd sizes, non-contiguous views and
each op's options (causal / boolean / additive masks, a fully masked row, ignore_index, gelu tanh,
rotary with broadcast cos/sin, swiglu's dim, AdamW from fresh and from running state).
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from . import reference
from hal.contract.kernel import OP_NAMES
from .tolerances import tolerance

Build = Callable[[torch.device], tuple[tuple, dict]]


@dataclass(frozen=True)
class OpCase:
    """One input case of an op. `build(device)` makes fresh inputs each call (same values every
    time), so in-place kernels and non-contiguous views never leak between runs."""

    op: str
    name: str
    dtype: torch.dtype
    build: Build = field(repr=False)
    mutates: tuple[int, ...] = ()  # positional args the op updates in place (adamw_step)

    @property
    def label(self) -> str:
        return f"{self.op}[{self.name}]"


@dataclass
class CheckResult:
    """How one kernel did on one case."""

    op: str
    case: str
    dtype: str
    kernel: str
    rtol: float
    atol: float
    max_abs_err: float = 0.0
    worst_ratio: float = 0.0  # max over elements of |out - golden| / (atol + rtol |golden|); <= 1 passes
    problem: Optional[str] = None  # shape/dtype mismatch, non-finite output, exception

    @property
    def ok(self) -> bool:
        return self.problem is None and self.worst_ratio <= 1.0

    def describe(self) -> str:
        verdict = "PASS" if self.ok else "FAIL"
        detail = self.problem or (f"max|err| {self.max_abs_err:.3g}, worst err/allowed {self.worst_ratio:.3g} "
                                  f"(rtol {self.rtol:.3g}, atol {self.atol:.3g})")
        return f"{self.op}[{self.case}] {self.dtype} via {self.kernel}: {verdict}: {detail}"


# ---- inputs ---------------------------------------------------------------------------------
def _generator(op: str, name: str, seed: int) -> torch.Generator:
    # Same values in every process and for every dtype (drawn in float32, then rounded to dtype).
    return torch.Generator().manual_seed(zlib.crc32(f"{op}/{name}/{seed}".encode()))


def _randn(g: torch.Generator, shape: Sequence[int], dtype: torch.dtype, device: torch.device,
           scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    return (torch.randn(tuple(shape), generator=g) * scale + shift).to(device=device, dtype=dtype)


def _transposed(g: torch.Generator, shape: Sequence[int], dtype: torch.dtype, device: torch.device,
                scale: float = 1.0) -> torch.Tensor:
    """A non-contiguous view of `shape`: the last two dims stored swapped."""
    *lead, a, b = shape
    return _randn(g, (*lead, b, a), dtype, device, scale).transpose(-1, -2)


def _strided(g: torch.Generator, shape: Sequence[int], dtype: torch.dtype, device: torch.device,
             scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    """A non-contiguous view of `shape`: every other element of a last dim twice as long."""
    *lead, n = shape
    return _randn(g, (*lead, 2 * n), dtype, device, scale, shift)[..., ::2]


def _case(op: str, name: str, dtype: torch.dtype, seed: int,
          make: Callable[[torch.Generator, torch.device], tuple[tuple, dict]],
          mutates: tuple[int, ...] = ()) -> OpCase:
    def build(device: torch.device) -> tuple[tuple, dict]:
        return make(_generator(op, name, seed), torch.device(device))
    return OpCase(op, name, dtype, build, mutates)


def _linear_cases(d, s):
    k = 37
    w_scale = 1 / math.sqrt(k)
    return [
        _case("linear", "bias", d, s, lambda g, dev: ((_randn(g, (3, 5, k), d, dev),
                                                        _randn(g, (19, k), d, dev, w_scale),
                                                        _randn(g, (19,), d, dev)), {})),
        _case("linear", "no_bias", d, s, lambda g, dev: ((_randn(g, (7, k), d, dev),
                                                           _randn(g, (11, k), d, dev, w_scale)), {})),
        _case("linear", "noncontig", d, s, lambda g, dev: ((_transposed(g, (2, 6, k), d, dev),
                                                             _transposed(g, (19, k), d, dev, w_scale),
                                                             _strided(g, (19,), d, dev)), {})),
    ]


def _matmul_cases(d, s):
    return [
        _case("matmul", "2d", d, s, lambda g, dev: ((_randn(g, (13, 37), d, dev),
                                                     _randn(g, (37, 11), d, dev, 37 ** -0.5)), {})),
        _case("matmul", "broadcast", d, s, lambda g, dev: ((_randn(g, (2, 3, 7, 16), d, dev),
                                                            _randn(g, (16, 5), d, dev, 0.25)), {})),
        _case("matmul", "noncontig", d, s, lambda g, dev: ((_transposed(g, (3, 9, 33), d, dev),
                                                            _transposed(g, (3, 33, 7), d, dev, 33 ** -0.5)), {})),
    ]


def _rms_norm_cases(d, s):
    return [
        _case("rms_norm", "basic", d, s, lambda g, dev: ((_randn(g, (4, 7, 37), d, dev, 2.0),
                                                          _randn(g, (37,), d, dev, 0.1, 1.0)), {})),
        _case("rms_norm", "eps", d, s, lambda g, dev: ((_randn(g, (5, 64), d, dev, 0.05),
                                                        _randn(g, (64,), d, dev, 0.1, 1.0)), {"eps": 1e-3})),
        _case("rms_norm", "noncontig", d, s, lambda g, dev: ((_strided(g, (6, 37), d, dev),
                                                              _strided(g, (37,), d, dev, 0.1, 1.0)), {})),
    ]


def _layer_norm_cases(d, s):
    return [
        # A mean of 3 makes (x - mean) cancel: the kernel must not form it in 16-bit arithmetic.
        _case("layer_norm", "affine", d, s, lambda g, dev: ((_randn(g, (4, 7, 37), d, dev, 1.0, 3.0),
                                                             _randn(g, (37,), d, dev, 0.1, 1.0),
                                                             _randn(g, (37,), d, dev, 0.1)), {})),
        _case("layer_norm", "no_affine", d, s,
              lambda g, dev: ((_randn(g, (9, 64), d, dev), None, None), {"eps": 1e-3})),
        _case("layer_norm", "noncontig", d, s, lambda g, dev: ((_strided(g, (6, 37), d, dev),
                                                                _strided(g, (37,), d, dev, 0.1, 1.0),
                                                                _strided(g, (37,), d, dev, 0.1)), {})),
    ]


def _softmax_cases(d, s):
    return [
        _case("softmax", "last", d, s, lambda g, dev: ((_randn(g, (5, 37), d, dev, 3.0),), {})),
        _case("softmax", "dim0", d, s, lambda g, dev: ((_randn(g, (37, 5), d, dev, 3.0),), {"dim": 0})),
        _case("softmax", "noncontig", d, s, lambda g, dev: ((_transposed(g, (2, 7, 29), d, dev, 3.0),), {})),
    ]


def _sdpa_cases(d, s):
    B, H, S, D = 2, 3, 13, 16

    def qkv(g, dev, sq=S, sk=S):
        return _randn(g, (B, H, sq, D), d, dev), _randn(g, (B, H, sk, D), d, dev), _randn(g, (B, H, sk, D), d, dev)

    def bool_mask(g, dev):
        m = torch.rand((B, 1, S, S), generator=g) < 0.7
        m[..., 0] = True  # every query keeps a key: no fully masked row here
        return m.to(dev)

    def additive_mask(g, dev):
        m = -2.0 * torch.rand((S, S), generator=g)
        m[:, 5] = float("-inf")  # a masked key column; no row is fully masked
        return m.to(device=dev, dtype=d)

    def fully_masked(g, dev):
        m = torch.ones((S, S), dtype=torch.bool)
        m[2] = False  # query 2 sees no key: the reference gives zeros (older torch gave NaN)
        return m.to(dev)

    def bshd(g, dev):  # (B, S, H, D) storage viewed as (B, H, S, D), as after a projection
        return tuple(_randn(g, (B, S, H, D), d, dev).transpose(1, 2) for _ in range(3))

    return [
        _case("scaled_dot_product_attention", "plain", d, s, lambda g, dev: (qkv(g, dev), {})),
        _case("scaled_dot_product_attention", "causal", d, s, lambda g, dev: (qkv(g, dev), {"is_causal": True})),
        _case("scaled_dot_product_attention", "causal_rect", d, s,
              lambda g, dev: (qkv(g, dev, sq=5, sk=S), {"is_causal": True})),
        _case("scaled_dot_product_attention", "bool_mask", d, s,
              lambda g, dev: (qkv(g, dev), {"attn_mask": bool_mask(g, dev)})),
        _case("scaled_dot_product_attention", "additive_mask", d, s,
              lambda g, dev: (qkv(g, dev), {"attn_mask": additive_mask(g, dev)})),
        _case("scaled_dot_product_attention", "fully_masked_row", d, s,
              lambda g, dev: (qkv(g, dev), {"attn_mask": fully_masked(g, dev)})),
        _case("scaled_dot_product_attention", "scale", d, s, lambda g, dev: (qkv(g, dev), {"scale": 0.4})),
        _case("scaled_dot_product_attention", "noncontig", d, s, lambda g, dev: (bshd(g, dev), {"is_causal": True})),
    ]


def _gelu_cases(d, s):
    return [
        _case("gelu", "erf", d, s, lambda g, dev: ((_randn(g, (7, 37), d, dev, 2.0),), {})),
        _case("gelu", "tanh", d, s, lambda g, dev: ((_randn(g, (7, 37), d, dev, 2.0),), {"approximate": "tanh"})),
        _case("gelu", "noncontig", d, s, lambda g, dev: ((_strided(g, (5, 33), d, dev, 2.0),), {})),
    ]


def _silu_cases(d, s):
    return [
        _case("silu", "basic", d, s, lambda g, dev: ((_randn(g, (7, 37), d, dev, 2.0),), {})),
        _case("silu", "noncontig", d, s, lambda g, dev: ((_transposed(g, (5, 33), d, dev, 2.0),), {})),
    ]


def _swiglu_cases(d, s):
    return [
        _case("swiglu", "last", d, s, lambda g, dev: ((_randn(g, (5, 2 * 19), d, dev, 2.0),), {})),
        _case("swiglu", "dim0", d, s, lambda g, dev: ((_randn(g, (2 * 6, 7), d, dev, 2.0),), {"dim": 0})),
        _case("swiglu", "dim1_of_3", d, s, lambda g, dev: ((_randn(g, (3, 2 * 5, 4), d, dev, 2.0),), {"dim": 1})),
        _case("swiglu", "noncontig", d, s, lambda g, dev: ((_transposed(g, (3, 2 * 9), d, dev, 2.0),), {})),
    ]


def rotary_tables(seq: int, dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (seq, dim) in the Llama/NeoX layout: angles pos * base^(-2i/dim), repeated
    for the two halves of the head dimension."""
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    freqs = torch.outer(torch.arange(seq, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _rotary_cases(d, s):
    B, S, H, D = 2, 11, 3, 16

    def tables(dev, shape):
        cos, sin = rotary_tables(S, D)
        return cos.reshape(shape).to(dev, d), sin.reshape(shape).to(dev, d)

    return [
        _case("rotary_embedding", "bshd", d, s,  # x (B, S, H, D), cos/sin (1, S, 1, D)
              lambda g, dev: ((_randn(g, (B, S, H, D), d, dev), *tables(dev, (1, S, 1, D))), {})),
        _case("rotary_embedding", "bhsd", d, s,  # x (B, H, S, D), cos/sin (S, D)
              lambda g, dev: ((_randn(g, (B, H, S, D), d, dev), *tables(dev, (S, D))), {})),
        _case("rotary_embedding", "noncontig", d, s,
              lambda g, dev: ((_randn(g, (B, S, H, D), d, dev).transpose(1, 2), *tables(dev, (S, D))), {})),
    ]


def _cross_entropy_cases(d, s):
    N, C = 11, 29

    def target(g, dev, ignore=-100, n_ignored=3):
        t = torch.randint(0, C, (N,), generator=g)
        t[torch.randperm(N, generator=g)[:n_ignored]] = ignore
        return t.to(dev)

    return [
        _case("cross_entropy", "mean", d, s, lambda g, dev: ((_randn(g, (N, C), d, dev, 2.0), target(g, dev)), {})),
        _case("cross_entropy", "sum", d, s, lambda g, dev: ((_randn(g, (N, C), d, dev, 2.0), target(g, dev)),
                                                            {"reduction": "sum"})),
        _case("cross_entropy", "none", d, s, lambda g, dev: ((_randn(g, (N, C), d, dev, 2.0), target(g, dev)),
                                                             {"reduction": "none"})),
        # ignore_index=3 is a valid class: rows whose target is 3 must drop out of the mean.
        _case("cross_entropy", "ignore_index_3", d, s,
              lambda g, dev: ((_randn(g, (N, C), d, dev, 2.0), target(g, dev, ignore=3, n_ignored=4)),
                              {"ignore_index": 3})),
        # Every target ignored: the reference's mean is 0 (torch's is NaN, 0/0).
        _case("cross_entropy", "all_ignored", d, s,
              lambda g, dev: ((_randn(g, (N, C), d, dev, 2.0), target(g, dev, n_ignored=N)), {})),
        _case("cross_entropy", "noncontig", d, s,
              lambda g, dev: ((_transposed(g, (N, C), d, dev, 2.0), target(g, dev)), {})),
    ]


def _embedding_cases(d, s):
    V, h = 50, 16
    return [
        _case("embedding", "basic", d, s, lambda g, dev: ((torch.randint(0, V, (3, 7), generator=g).to(dev),
                                                           _randn(g, (V, h), d, dev)), {})),
        _case("embedding", "noncontig", d, s, lambda g, dev: ((torch.randint(0, V, (13,), generator=g).to(dev),
                                                               _transposed(g, (V, h), d, dev)), {})),
    ]


def _adamw_state(g, dev, d, shapes, fresh: bool, view: bool = False):
    mk = (lambda sh, scale=1.0, shift=0.0: _strided(g, sh, d, dev, scale, shift)) if view else \
        (lambda sh, scale=1.0, shift=0.0: _randn(g, sh, d, dev, scale, shift))
    params = [mk(sh) for sh in shapes]
    grads = [mk(sh) for sh in shapes]
    if fresh:
        m = [torch.zeros(sh, dtype=d, device=dev) for sh in shapes]
        v = [torch.zeros(sh, dtype=d, device=dev) for sh in shapes]
    else:
        m = [mk(sh, 0.1) for sh in shapes]
        v = [mk(sh, 0.01).square() for sh in shapes]
    return params, grads, m, v


def _adamw_cases(d, s):
    shapes = [(7, 13), (37,)]
    hyper = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1)

    def step(fresh, t, view=False):
        def make(g, dev):
            return (*_adamw_state(g, dev, d, shapes, fresh, view), t), dict(hyper)
        return make

    return [
        _case("adamw_step", "step1_fresh", d, s, step(True, 1), mutates=(0, 2, 3)),
        _case("adamw_step", "step5_state", d, s, step(False, 5), mutates=(0, 2, 3)),
        _case("adamw_step", "noncontig", d, s, step(False, 3, view=True), mutates=(0, 2, 3)),
    ]


_CASES = {
    "linear": _linear_cases, "matmul": _matmul_cases, "rms_norm": _rms_norm_cases,
    "layer_norm": _layer_norm_cases, "softmax": _softmax_cases,
    "scaled_dot_product_attention": _sdpa_cases, "gelu": _gelu_cases, "silu": _silu_cases,
    "swiglu": _swiglu_cases, "rotary_embedding": _rotary_cases, "cross_entropy": _cross_entropy_cases,
    "embedding": _embedding_cases, "adamw_step": _adamw_cases,
}
assert set(_CASES) == set(OP_NAMES), f"golden cases missing for {set(OP_NAMES) - set(_CASES)}"


def cases(op: str, dtype: torch.dtype, seed: int = 0) -> list[OpCase]:
    """The input cases of `op` in `dtype` (a HAL op name; KeyError names the known ops)."""
    if op not in _CASES:
        raise KeyError(f"no golden cases for op {op!r}; HAL ops are {list(OP_NAMES)}")
    return _CASES[op](dtype, seed)


# ---- running and comparing ------------------------------------------------------------------
def _map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map_tensors(v, fn) for k, v in value.items()}
    return value


def _to_float64(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().to("cpu")
    return t.to(torch.float64) if t.is_floating_point() else t.clone()


def _outputs(result: Any, args: tuple, mutates: tuple[int, ...]) -> list[torch.Tensor]:
    if mutates:
        return [t for i in mutates for t in args[i]]
    return [result]


def run(fn: Callable, case: OpCase, device: Any = "cpu") -> list[torch.Tensor]:
    """Run `fn` (a kernel, or a `hal.ops` function) on fresh inputs of `case`; its outputs."""
    args, kwargs = case.build(torch.device(device))
    return _outputs(fn(*args, **kwargs), args, case.mutates)


def golden(case: OpCase) -> list[torch.Tensor]:
    """The reference kernel of `case.op` on float64 copies of the case's inputs (on the CPU)."""
    args, kwargs = case.build(torch.device("cpu"))
    args, kwargs = _map_tensors(args, _to_float64), _map_tensors(kwargs, _to_float64)
    return _outputs(reference.KERNELS[case.op](*args, **kwargs), args, case.mutates)


def compare(outs: Sequence[Any], golds: Sequence[torch.Tensor], dtype: torch.dtype, rtol: float,
            atol: float) -> tuple[float, float, Optional[str]]:
    """(max |err|, worst err/allowed, problem or None) of outputs against the golden."""
    if len(outs) != len(golds):
        return math.inf, math.inf, f"{len(outs)} outputs, expected {len(golds)}"
    max_err = worst = 0.0
    for i, (out, gold) in enumerate(zip(outs, golds)):
        where = f"output {i}: " if len(golds) > 1 else ""
        if not isinstance(out, torch.Tensor):
            return math.inf, math.inf, f"{where}returned {type(out).__name__}, expected a tensor"
        if tuple(out.shape) != tuple(gold.shape):
            return math.inf, math.inf, f"{where}shape {tuple(out.shape)}, expected {tuple(gold.shape)}"
        if out.dtype != dtype:
            return math.inf, math.inf, f"{where}dtype {out.dtype}, expected {dtype}"
        o = out.detach().to("cpu", torch.float64)
        bad = ~torch.isfinite(o) & torch.isfinite(gold)
        if bad.any():
            idx = tuple(int(j) for j in bad.nonzero()[0])
            return math.inf, math.inf, (f"{where}non-finite value {o[idx].item()} at {idx} where the golden "
                                        f"is {gold[idx].item():.6g}")
        err = (o - gold).abs().nan_to_num(0.0)  # both non-finite and equal: no error
        err = torch.where(o == gold, torch.zeros_like(err), err)
        allowed = atol + rtol * gold.abs()
        if err.numel():
            max_err = max(max_err, err.max().item())
            ratio = torch.where(err == 0, torch.zeros_like(err), err / allowed)
            worst = max(worst, ratio.max().item())
    return max_err, worst, None


def check(fn: Callable, case: OpCase, kernel: str = "", device: Any = "cpu") -> CheckResult:
    """Run `fn` on `case` and compare with the golden under the op's tolerance for the case's dtype."""
    rtol, atol = tolerance(case.op, case.dtype)
    res = CheckResult(case.op, case.name, str(case.dtype).removeprefix("torch."), kernel, rtol, atol)
    try:
        outs = run(fn, case, device)
    except Exception as exc:  # a kernel that raises fails the check; the message says how
        res.problem = f"raised {type(exc).__name__}: {exc}"
        return res
    res.max_abs_err, res.worst_ratio, res.problem = compare(outs, golden(case), case.dtype, rtol, atol)
    return res


def check_op(fn: Callable, op: str, dtype: torch.dtype, kernel: str = "", device: Any = "cpu",
             seed: int = 0) -> list[CheckResult]:
    """`check` on every case of `op` in `dtype`."""
    return [check(fn, c, kernel, device) for c in cases(op, dtype, seed)]
