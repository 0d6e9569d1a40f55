"""Op overrides on Kunlun XPUs: torch.nn.functional's single ops, which KunlunXin's build dispatches
to its own kernels (one kernel where the HAL reference chains several elementwise ops).

No vendor-specific fused kernel is offered: KunlunXin's fused ops (kunlun_ops, xtorch_ops in
vLLM-Kunlun) are inference kernels with their own conventions, and we have not checked them against
the HAL semantics on hardware. Attention and AdamW keep the reference until that is done.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import hal


def _rms_norm(x, weight, eps=1e-6):
    return F.rms_norm(x, x.shape[-1:], weight, eps)


def _layer_norm(x, weight, bias, eps=1e-5):
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def _softmax(x, dim=-1):
    return torch.softmax(x, dim, dtype=torch.promote_types(x.dtype, torch.float32)).to(x.dtype)


def _gelu(x, approximate="none"):
    return F.gelu(x, approximate=approximate)


def _cross_entropy(logits, target, ignore_index=-100, reduction="mean"):
    acc = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if reduction != "mean":
        return F.cross_entropy(acc, target, ignore_index=ignore_index, reduction=reduction).to(logits.dtype)
    # torch's mean over zero kept targets is 0/0 = NaN; the HAL's (the reference's) is 0.
    total = F.cross_entropy(acc, target, ignore_index=ignore_index, reduction="sum")
    return (total / (target != ignore_index).sum().clamp(min=1)).to(logits.dtype)


def op_kernels(priority: int = 10) -> list[hal.OpKernel]:
    table = [("rms_norm", _rms_norm), ("layer_norm", _layer_norm), ("softmax", _softmax), ("gelu", _gelu),
             ("silu", F.silu), ("cross_entropy", _cross_entropy), ("embedding", F.embedding),
             ("linear", F.linear)]
    return [hal.OpKernel(op, fn, priority=priority, name=f"torch.{op}") for op, fn in table]
