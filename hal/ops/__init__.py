"""`hal.ops`: device-agnostic operators that dispatch to the best kernel for the bound chip.

Each function below is a one-line forwarder to a module global (`_linear`, ...) that `bind()`
sets from the accelerator's kernel table whenever hal.core.selection binds one (this module registers
with `selection.on_bind`: it sits above selection); before that it points at a stub that binds the
accelerator and retries. So a call costs one Python call and one global lookup, nothing more: no
plugin lookup, no dict access (`benchmarks/dispatch.py` measures it).
"""
from __future__ import annotations

from typing import Callable, Mapping, Optional

from hal.contract.kernel import OP_NAMES, OP_SIGNATURES, OpKernel
from hal.core import selection as _selection

from . import reference

__all__ = ["OP_NAMES", "OP_SIGNATURES", "OpKernel", "reference", "bind", "unbind", "bound_kernels",
           *OP_NAMES]

_bound: dict[str, OpKernel] = {}


def _binding_stub(op: str) -> Callable:
    def stub(*args, **kwargs):
        bind(_selection.accelerator().kernels)
        return globals()["_" + op](*args, **kwargs)
    stub.__name__ = f"bind_then_{op}"
    return stub


def bind(kernels: Mapping[str, OpKernel]) -> None:
    """Point every op at its selected kernel. Called by the accelerator at bind time."""
    missing = set(OP_NAMES) - set(kernels)
    if missing:
        raise ValueError(f"bind: no kernel for ops {sorted(missing)}")
    _bound.clear()
    _bound.update(kernels)
    g = globals()
    for op in OP_NAMES:
        g["_" + op] = kernels[op].fn


def unbind() -> None:
    """Forget the bound kernels (tests that rebind another chip)."""
    _bound.clear()
    g = globals()
    for op in OP_NAMES:
        g["_" + op] = _binding_stub(op)


def bound_kernels() -> dict[str, OpKernel]:
    """The kernel each op dispatches to now (empty before the first bind)."""
    return dict(_bound)


def _on_bind(kernels: Optional[Mapping[str, OpKernel]]) -> None:
    if kernels is None:
        unbind()
    else:
        bind(kernels)


unbind()
_selection.on_bind(_on_bind)
_acc = _selection.bound()
if _acc is not None:  # bound before this module was first imported
    bind(_acc.kernels)


def linear(x, weight, bias=None):
    return _linear(x, weight, bias)  # noqa: F821 - set by bind()


def matmul(a, b):
    return _matmul(a, b)  # noqa: F821


def rms_norm(x, weight, eps=1e-6):
    return _rms_norm(x, weight, eps)  # noqa: F821


def layer_norm(x, weight, bias, eps=1e-5):
    return _layer_norm(x, weight, bias, eps)  # noqa: F821


def softmax(x, dim=-1):
    return _softmax(x, dim)  # noqa: F821


def scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=False, scale=None):
    return _scaled_dot_product_attention(q, k, v, attn_mask, is_causal, scale)  # noqa: F821


def gelu(x, approximate="none"):
    return _gelu(x, approximate)  # noqa: F821


def silu(x):
    return _silu(x)  # noqa: F821


def swiglu(x, dim=-1):
    return _swiglu(x, dim)  # noqa: F821


def rotary_embedding(x, cos, sin):
    return _rotary_embedding(x, cos, sin)  # noqa: F821


def cross_entropy(logits, target, ignore_index=-100, reduction="mean"):
    return _cross_entropy(logits, target, ignore_index, reduction)  # noqa: F821


def embedding(ids, weight):
    return _embedding(ids, weight)  # noqa: F821


def adamw_step(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps, weight_decay):
    return _adamw_step(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps,  # noqa: F821
                       weight_decay)


for _op in OP_NAMES:
    globals()[_op].__doc__ = f"{_op}{OP_SIGNATURES[_op]}: see hal.ops.reference.{_op}."
