"""The ops interface: the op names and signatures every kernel must follow, and `OpKernel`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

# op name -> signature every kernel for it takes (the reference kernel in `reference.py` is the
# executable definition; shapes in its docstrings).
OP_SIGNATURES: dict[str, str] = {
    "linear": "(x, weight, bias=None)",
    "matmul": "(a, b)",
    "rms_norm": "(x, weight, eps=1e-6)",
    "layer_norm": "(x, weight, bias, eps=1e-5)",
    "softmax": "(x, dim=-1)",
    "scaled_dot_product_attention": "(q, k, v, attn_mask=None, is_causal=False, scale=None)",
    "gelu": "(x, approximate='none')",
    "silu": "(x)",
    "swiglu": "(x, dim=-1)",
    "rotary_embedding": "(x, cos, sin)",
    "cross_entropy": "(logits, target, ignore_index=-100, reduction='mean')",
    "embedding": "(ids, weight)",
    "adamw_step": "(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps, weight_decay)",
}
OP_NAMES: tuple[str, ...] = tuple(OP_SIGNATURES)


@dataclass(frozen=True)
class OpKernel:
    """A kernel for one HAL op. The highest `priority` registered for the bound chip wins; the
    reference kernel has priority 0. `plugin` is filled in by the plugin manager."""

    op: str
    fn: Callable = field(repr=False)
    priority: int = 10
    name: str = ""
    plugin: str = ""

    def describe(self) -> str:
        label = self.name or getattr(self.fn, "__qualname__", repr(self.fn))
        return f"{label} (plugin {self.plugin or '?'}, priority {self.priority})"
