"""Kernels built on torch's own single and fused ops, with the HAL's semantics.

Any plugin whose PyTorch build dispatches these torch calls to its device offers them (the `cpu`
chip and emulated chips on CPU tensors, CUDA, Ascend through torch_npu, Kunlun's torch build): one
torch kernel where the readable reference chains several elementwise ops. Where torch's semantics
differ from the HAL's they are adapted here, once:
- attention: torch refuses attn_mask together with is_causal, so the causal triangle is folded into
  the mask; rows with no key to attend to are zeroed (the HAL reference zeros them);
- rms_norm upcasts 16-bit inputs where torch's own does not accumulate them in float32 (torch 2.5);
- softmax / cross_entropy accumulate 16-bit inputs in float32 (float64 stays float64), and a mean
  over zero kept targets is 0, not torch's 0/0 = NaN;
- adamw_step uses torch's fused AdamW (math in float32 for 16-bit tensors, like the reference; the
  foreach path would compute in float16 and overflow); strided views take the reference, since
  torch 2.13's fused CPU kernel is wrong on them (found by tests/test_ops.py).
Every kernel here is checked against the float64 golden by tests/test_ops.py (through hal_cpu) and
the vendor plugins' tests.
"""
from __future__ import annotations

from typing import Iterable, Optional

import torch
import torch.nn.functional as F
from torch.optim.adamw import adamw as _torch_adamw

from hal.contract.compat import rms_norm_accumulates_wide
from hal.contract.kernel import OpKernel
from . import reference


def scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=False, scale=None):
    if attn_mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)
    sq, sk = q.size(-2), k.size(-2)
    if attn_mask.dtype == torch.bool:
        allowed = attn_mask
        if is_causal:
            allowed = allowed & torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril()
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale)
        dead = ~allowed.any(-1, keepdim=True)
    else:
        additive = attn_mask.to(q.dtype)
        if is_causal:
            causal = torch.zeros(sq, sk, dtype=q.dtype, device=q.device)
            additive = additive + causal.masked_fill(~torch.ones_like(causal, dtype=torch.bool).tril(),
                                                     float("-inf"))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=additive, scale=scale)
        dead = torch.isneginf(additive).all(-1, keepdim=True)
    return out.masked_fill(dead, 0.0)


@torch.no_grad()
def adamw_step(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps, weight_decay):
    # The fused kernel does its math in float32 for 16-bit tensors, like the reference (torch's
    # foreach path would compute in float16 and overflow). Strided views take the reference: torch
    # 2.13's fused CPU kernel is wrong on them (found by tests/test_ops.py via hal_cpu) and the
    # multi-tensor CUDA kernel is written for dense tensors.
    if step < 1:
        raise ValueError(f"adamw_step: step counts from 1, got {step}")
    params = list(params)
    if not params:
        return
    if not all(t.is_contiguous() for ts in (params, grads, exp_avgs, exp_avg_sqs) for t in ts):
        return reference.adamw_step(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps,
                                    weight_decay)
    # One counter per tensor (the fused kernel increments each before use, so the buffer holds
    # step - 1); views of one buffer keep it to a single allocation per call.
    counters = torch.full((len(params),), float(step - 1), dtype=torch.float32, device=params[0].device)
    _torch_adamw(params, list(grads), list(exp_avgs), list(exp_avg_sqs), [], list(counters.unbind(0)),
                 fused=True, amsgrad=False, beta1=beta1, beta2=beta2, lr=lr,
                 weight_decay=weight_decay, eps=eps, maximize=False)


def rms_norm(x, weight, eps=1e-6):
    if x.dtype in (torch.float16, torch.bfloat16) and not rms_norm_accumulates_wide():  # torch 2.5
        w = weight.float() if weight is not None else None
        return F.rms_norm(x.float(), x.shape[-1:], w, eps).to(x.dtype)
    return F.rms_norm(x, x.shape[-1:], weight, eps)


def layer_norm(x, weight, bias, eps=1e-5):
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def softmax(x, dim=-1):
    return torch.softmax(x, dim, dtype=torch.promote_types(x.dtype, torch.float32)).to(x.dtype)


def gelu(x, approximate="none"):
    return F.gelu(x, approximate=approximate)


def silu(x):
    return F.silu(x)


def cross_entropy(logits, target, ignore_index=-100, reduction="mean"):
    acc = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if reduction != "mean":
        return F.cross_entropy(acc, target, ignore_index=ignore_index, reduction=reduction).to(logits.dtype)
    # torch's mean over zero kept targets is 0/0 = NaN; the HAL's (the reference's) is 0.
    total = F.cross_entropy(acc, target, ignore_index=ignore_index, reduction="sum")
    return (total / (target != ignore_index).sum().clamp(min=1)).to(logits.dtype)


def embedding(ids, weight):
    return F.embedding(ids, weight)


def linear(x, weight, bias=None):
    return F.linear(x, weight, bias)


KERNELS = {
    "scaled_dot_product_attention": (scaled_dot_product_attention, "torch.sdpa"),
    "adamw_step": (adamw_step, "torch.optim.adamw(fused=True)"),
    "rms_norm": (rms_norm, "torch.rms_norm"), "layer_norm": (layer_norm, "torch.layer_norm"),
    "softmax": (softmax, "torch.softmax"), "gelu": (gelu, "torch.gelu"), "silu": (silu, "torch.silu"),
    "cross_entropy": (cross_entropy, "torch.cross_entropy"), "embedding": (embedding, "torch.embedding"),
    "linear": (linear, "torch.linear"),
}


def torch_kernels(priority: int, ops: Optional[Iterable[str]] = None, plugin: str = "") -> list[OpKernel]:
    """`OpKernel`s for `ops` (default: every op above) at `priority`, named after the torch call."""
    names = list(KERNELS) if ops is None else list(ops)
    unknown = [op for op in names if op not in KERNELS]
    if unknown:
        raise ValueError(f"torch_kernels: no torch kernel for {unknown}; available: {sorted(KERNELS)}")
    return [OpKernel(op, KERNELS[op][0], priority=priority, name=KERNELS[op][1], plugin=plugin) for op in names]
