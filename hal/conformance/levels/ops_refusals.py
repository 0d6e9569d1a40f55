"""Level `ops`, check `ops.refusals.<op>`: inputs the HAL reference refuses, or answers with NaN/inf.

A kernel that quietly returns a value where the reference raises trains a model on garbage: an
embedding that clamps a token id past the vocabulary (a tokenizer / vocabulary mismatch), a
cross-entropy that skips a target >= the class count, a matmul that broadcasts mismatched shapes.
Each op has a small table of such cases: out-of-range indices, shape and dtype mismatches, bad
options, empty inputs, NaN and inf where the reference defines the output. The HAL reference
(`hal.ops.reference`, plain torch) runs each case on the CPU, then the chip's kernel runs it on the
chip's device:

* the reference raises  -> the kernel must raise (any exception type: the contract names none);
* the reference returns -> the kernel must return the same: same shape, NaN where it is NaN, the
  same infinities, finite values within the op's float32 tolerance (`hal.ops.tolerances`).

A case marked `either` accepts a kernel that returns where the reference raises, or raises where it
returns, because torch's own kernels differ from the HAL reference there: the reference indexes
(`weight[ids]`), so a negative id wraps as in Python, where torch.nn.functional.embedding raises;
torch's CPU sdpa accepts a value length other than the key length, and torch's fused AdamW grads of
another shape. There the verdict is only that the kernel does not crash the process. Cases are float32
(the refusals do not depend on the dtype) and tiny, so the check costs milliseconds per op.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Callable, Optional

import torch

Make = Callable[[torch.Generator], tuple[tuple, dict]]
F32 = torch.float32


@dataclass(frozen=True)
class Refusal:
    """One case: `make(g)` gives (args, kwargs) on the CPU (moved to the device for the kernel)."""

    name: str
    make: Make
    either: bool = False  # the kernel may raise even where the reference returns (see the module doc)
    mutates: tuple[int, ...] = ()


def _r(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=g)


def _with(t: torch.Tensor, idx: tuple, value: float) -> torch.Tensor:
    t = t.clone()
    t[idx] = value
    return t


def _ids(*values: int, dtype: torch.dtype = torch.long) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def _adam(g, shapes_p, shapes_g, step=1, nan=False, **hyper):
    p = [_r(g, *s) for s in shapes_p]
    gr = [_r(g, *s) for s in shapes_g]
    if nan:
        gr[0] = _with(gr[0], (0,), math.nan)
    m = [torch.zeros(s) for s in shapes_p]
    v = [torch.zeros(s) for s in shapes_p]
    kw = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1)
    kw.update(hyper)
    return (p, gr, m, v, step), kw


def _ce(n_cls: int, *target: int, **kw) -> Make:
    return lambda g: ((_r(g, len(target), n_cls), _ids(*target)), kw)


INF, NAN = math.inf, math.nan

# op -> its refusal table. Names say what the case is; the reference decides what must happen.
REFUSALS: dict[str, list[Refusal]] = {
    "linear": [
        Refusal("in_features_mismatch", lambda g: ((_r(g, 3, 5), _r(g, 4, 6), _r(g, 4)), {})),
        Refusal("bias_shape_mismatch", lambda g: ((_r(g, 3, 5), _r(g, 4, 5), _r(g, 7)), {})),
        Refusal("dtype_mismatch", lambda g: ((_r(g, 3, 5), _r(g, 4, 5).double(), None), {})),
        Refusal("int_ids_as_x", lambda g: ((_ids(1, 2, 3, 4, 5).reshape(1, 5), _r(g, 4, 5), None), {})),
        Refusal("nan_inf_input", lambda g: ((_with(_with(_r(g, 3, 5), (0, 1), NAN), (1, 2), INF), _r(g, 4, 5),
                                             _r(g, 4)), {})),
        Refusal("empty_in_features", lambda g: ((_r(g, 3, 0), _r(g, 4, 0), _r(g, 4)), {})),
    ],
    "matmul": [
        Refusal("inner_mismatch", lambda g: ((_r(g, 3, 4), _r(g, 5, 6)), {})),
        Refusal("batch_mismatch", lambda g: ((_r(g, 2, 3, 4), _r(g, 3, 4, 5)), {})),
        Refusal("zero_dim", lambda g: ((torch.tensor(2.0), _r(g, 3)), {})),
        Refusal("dtype_mismatch", lambda g: ((_r(g, 3, 4), _r(g, 4, 5).double()), {})),
        Refusal("inf_times_zero", lambda g: ((_with(_r(g, 3, 4), (0, 0), INF), _with(_r(g, 4, 5), (0, 1), 0.0)),
                                             {})),
    ],
    "rms_norm": [
        Refusal("weight_shape_mismatch", lambda g: ((_r(g, 3, 8), _r(g, 7)), {})),
        Refusal("nan_inf_row", lambda g: ((_with(_with(_r(g, 3, 8), (0, 2), NAN), (1, 3), INF), _r(g, 8)), {})),
    ],
    "layer_norm": [
        Refusal("weight_shape_mismatch", lambda g: ((_r(g, 3, 8), _r(g, 7), _r(g, 8)), {})),
        Refusal("bias_shape_mismatch", lambda g: ((_r(g, 3, 8), _r(g, 8), _r(g, 5)), {})),
        Refusal("nan_inf_row", lambda g: ((_with(_with(_r(g, 3, 8), (0, 2), NAN), (1, 3), INF), _r(g, 8),
                                           _r(g, 8)), {})),
    ],
    "softmax": [
        Refusal("dim_out_of_range", lambda g: ((_r(g, 3, 8),), {"dim": 2})),
        Refusal("inf_nan_rows", lambda g: ((_with(_with(_r(g, 3, 8), (0, 2), INF), (1, 3), NAN),), {})),
        Refusal("all_minus_inf_row", lambda g: ((torch.cat([torch.full((1, 8), -INF), _r(g, 2, 8)]),), {})),
    ],
    "scaled_dot_product_attention": [
        Refusal("head_dim_mismatch", lambda g: ((_r(g, 1, 2, 5, 8), _r(g, 1, 2, 5, 4), _r(g, 1, 2, 5, 8)), {})),
        # torch's own CPU sdpa (the cpu plugin's override) returns here, reading k's length: `either`
        Refusal("kv_seq_mismatch", lambda g: ((_r(g, 1, 2, 5, 8), _r(g, 1, 2, 5, 8), _r(g, 1, 2, 6, 8)), {}),
                either=True),
        Refusal("mask_shape_mismatch", lambda g: ((_r(g, 1, 2, 5, 8), _r(g, 1, 2, 5, 8), _r(g, 1, 2, 5, 8)),
                                                  {"attn_mask": torch.ones(4, 4, dtype=torch.bool)})),
        Refusal("nan_in_value", lambda g: ((_r(g, 1, 2, 5, 8), _r(g, 1, 2, 5, 8),
                                            _with(_r(g, 1, 2, 5, 8), (0, 0, 3, 1), NAN)), {})),
    ],
    "gelu": [
        Refusal("unknown_approximate", lambda g: ((_r(g, 3, 5),), {"approximate": "fast"})),
        Refusal("nan_inf", lambda g: ((_with(_with(_r(g, 3, 5), (0, 1), NAN), (1, 1), INF),), {})),
    ],
    "silu": [
        Refusal("nan_inf", lambda g: ((_with(_with(_r(g, 3, 5), (0, 1), NAN), (1, 1), INF),), {})),
    ],
    "swiglu": [
        Refusal("odd_size", lambda g: ((_r(g, 3, 7),), {})),
        Refusal("odd_size_dim0", lambda g: ((_r(g, 5, 8),), {"dim": 0})),
        Refusal("dim_out_of_range", lambda g: ((_r(g, 4, 8),), {"dim": 3})),
        Refusal("nan_inf", lambda g: ((_with(_with(_r(g, 3, 8), (0, 1), NAN), (1, 5), INF),), {})),
    ],
    "rotary_embedding": [
        Refusal("table_seq_mismatch", lambda g: ((_r(g, 2, 5, 3, 8), _r(g, 1, 4, 1, 8), _r(g, 1, 4, 1, 8)), {})),
        Refusal("table_dim_mismatch", lambda g: ((_r(g, 2, 5, 3, 8), _r(g, 1, 5, 1, 4), _r(g, 1, 5, 1, 4)), {})),
        Refusal("nan_in_x", lambda g: ((_with(_r(g, 1, 5, 2, 8), (0, 1, 1, 2), NAN), _r(g, 1, 5, 1, 8),
                                        _r(g, 1, 5, 1, 8)), {})),
    ],
    "cross_entropy": [
        Refusal("target_ge_classes", _ce(10, 1, 10, 3)),
        Refusal("target_far_past_classes", _ce(10, 1, 32000, 3)),
        Refusal("target_negative", _ce(10, 1, -1, 3)),
        Refusal("ignore_index_default", _ce(10, 1, -100, 3)),
        Refusal("ignore_index_custom", _ce(10, 1, 7, 3, ignore_index=7)),
        Refusal("ignore_index_not_default", _ce(10, 1, -100, 3, ignore_index=7)),
        Refusal("all_ignored", _ce(10, -100, -100)),
        Refusal("all_ignored_sum", _ce(10, -100, -100, reduction="sum")),
        Refusal("batch_mismatch", lambda g: ((_r(g, 4, 10), _ids(1, 2, 3, 4, 5)), {})),
        Refusal("float_target", lambda g: ((_r(g, 3, 10), _ids(1, 2, 3).float()), {})),
        Refusal("unknown_reduction", lambda g: ((_r(g, 3, 10), _ids(1, 2, 3)), {"reduction": "average"})),
        Refusal("inf_logit", lambda g: ((_with(_r(g, 3, 10), (1, 4), INF), _ids(1, 4, 3)), {"reduction": "none"})),
        Refusal("nan_logit", lambda g: ((_with(_r(g, 3, 10), (1, 4), NAN), _ids(1, 2, 3)), {"reduction": "none"})),
    ],
    "embedding": [
        Refusal("id_eq_vocab", lambda g: ((_ids(0, 3, 50, 7), _r(g, 50, 8)), {})),
        Refusal("id_far_past_vocab", lambda g: ((_ids(0, 32000, 7), _r(g, 50, 8)), {})),
        Refusal("id_past_vocab_2d", lambda g: ((_ids(1, 2, 3, 64).reshape(2, 2), _r(g, 50, 8)), {})),
        Refusal("id_below_minus_vocab", lambda g: ((_ids(0, -51, 7), _r(g, 50, 8)), {})),
        Refusal("id_negative", lambda g: ((_ids(0, -1, 7), _r(g, 50, 8)), {}), either=True),
        Refusal("float_ids", lambda g: ((_ids(0, 1, 2).float(), _r(g, 50, 8)), {})),
        Refusal("int32_ids", lambda g: ((_ids(0, 49, 7, dtype=torch.int32), _r(g, 50, 8)), {})),
        Refusal("empty_vocab", lambda g: ((_ids(0), torch.zeros(0, 8)), {})),
    ],
    "adamw_step": [
        Refusal("step_zero", lambda g: _adam(g, [(3, 4)], [(3, 4)], step=0), mutates=(0, 2, 3)),
        # torch.optim's fused AdamW (the cpu plugin's override) does not check shapes: `either`
        Refusal("grad_shape_mismatch", lambda g: _adam(g, [(3, 4)], [(5,)]), mutates=(0, 2, 3), either=True),
        Refusal("nan_grad", lambda g: _adam(g, [(3, 4), (5,)], [(3, 4), (5,)], nan=True), mutates=(0, 2, 3)),
    ],
}


def _to(value, dev):
    if isinstance(value, torch.Tensor):
        return value.to(dev)
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, dev) for v in value)
    if isinstance(value, dict):
        return {k: _to(v, dev) for k, v in value.items()}
    return value


def _run(fn: Callable, case: Refusal, op: str, dev) -> tuple[Optional[list], Optional[BaseException]]:
    from hal.ops.golden import _outputs
    g = torch.Generator().manual_seed(zlib.crc32(f"hal/conformance/refusals/{op}/{case.name}".encode()))
    args, kwargs = _to(case.make(g), dev)
    try:
        return _outputs(fn(*args, **kwargs), args, case.mutates), None
    except Exception as exc:  # the reference's and the kernel's refusals are what this check is about
        return None, exc


def _mismatch(outs: list, refs: list, op: str) -> Optional[str]:
    from hal.ops.tolerances import tolerance
    rtol, atol = tolerance(op, F32)
    if len(outs) != len(refs):
        return f"{len(outs)} outputs, the reference gives {len(refs)}"
    for out, ref in zip(outs, refs):
        if not isinstance(out, torch.Tensor):
            return f"returned {type(out).__name__}, the reference a tensor"
        o, r = out.detach().to("cpu"), ref.detach()
        if o.shape != r.shape or o.dtype != r.dtype:
            return f"returned {o.dtype} {tuple(o.shape)}, the reference {r.dtype} {tuple(r.shape)}"
        if not o.is_floating_point():
            if not torch.equal(o, r):
                return "integer output differs from the reference"
            continue
        o, r = o.double(), r.double()
        if not torch.equal(o.isnan(), r.isnan()):
            return (f"NaN at {int(o.isnan().sum())} places, the reference at {int(r.isnan().sum())} "
                    f"(values {o.flatten()[:6].tolist()} vs {r.flatten()[:6].tolist()})")
        inf = r.isinf() | o.isinf()
        if not torch.equal(o[inf], r[inf]):
            return f"infinities {o[inf].tolist()[:6]}, the reference {r[inf].tolist()[:6]}"
        fin = ~(inf | r.isnan())
        err = (o[fin] - r[fin]).abs() - (atol + rtol * r[fin].abs())
        if err.numel() and err.max() > 0:
            return f"values differ from the reference by more than the float32 tolerance (rtol {rtol:g}, atol {atol:g})"
    return None


def verdict(fn: Callable, op: str, case: Refusal, dev) -> Optional[str]:
    """None when the kernel does what the reference does on `case`, else what differs."""
    from hal.ops.reference import KERNELS
    refs, ref_exc = _run(KERNELS[op], case, op, "cpu")
    outs, exc = _run(fn, case, op, dev)
    if ref_exc is not None:
        if exc is None and not case.either:
            return (f"the reference raises {type(ref_exc).__name__} ({str(ref_exc).splitlines()[0][:120]}); "
                    f"the kernel returned a value instead of raising")
        return None
    if exc is not None:
        if case.either:
            return None
        return f"the reference returns a value; the kernel raised {type(exc).__name__}: {str(exc)[:160]}"
    assert outs is not None and refs is not None  # neither raised
    return _mismatch(outs, refs, op)


def check_refusals(ctx, op: str, addon: bool = False):
    from ..checks import CheckFailed, Passed
    if addon:
        from .addon import addon_kernel
        kernel = addon_kernel(ctx, op)
    else:
        kernel = ctx.acc.kernels[op]
    cases = REFUSALS[op]
    bad = [(c.name, why) for c in cases if (why := verdict(kernel.fn, op, c, ctx.device)) is not None]
    if bad:
        raise CheckFailed(f"{len(bad)} of {len(cases)} refusal cases differ from the HAL reference via "
                          f"{kernel.describe()} (a kernel must raise where the reference raises, and match it where "
                          f"it returns): " + "; ".join(f"{op}[{n}]: {w}" for n, w in bad))
    return Passed(f"{len(cases)} cases ({', '.join(c.name for c in cases)}) via {kernel.describe()}: "
                  f"raises where the reference raises, matches where it returns")
