"""Op overrides for NVIDIA GPUs: torch's fused CUDA paths, adapted to the HAL op semantics.

- scaled_dot_product_attention -> F.scaled_dot_product_attention, which picks the flash,
  memory-efficient or cuDNN kernel on CUDA. Same mask conventions as the HAL (bool True = attend,
  float = additive, is_causal top-left aligned); torch refuses attn_mask together with is_causal, so
  the causal triangle is folded into the mask; rows with no key to attend to are zeroed (torch gives
  NaN there, the HAL reference zeros).
- adamw_step -> torch's fused AdamW (`fused=True`, one kernel for all tensors); the step counters
  live on the device as torch.optim.AdamW keeps them for the fused path.
- rms_norm, layer_norm, softmax, gelu, silu, cross_entropy, embedding, linear -> torch.nn.functional,
  one CUDA kernel each instead of the reference's chain of elementwise ops.
These kernels need only torch, so the unit tests run them on CPU tensors against the reference.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.optim.adamw import adamw as _torch_adamw

import hal
from hal.ops import reference


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
    "scaled_dot_product_attention": (scaled_dot_product_attention, "torch.sdpa(flash/efficient/cudnn)"),
    "adamw_step": (adamw_step, "torch.optim.adamw(fused=True)"),
    "rms_norm": (rms_norm, "torch.rms_norm"), "layer_norm": (layer_norm, "torch.layer_norm"),
    "softmax": (softmax, "torch.softmax"), "gelu": (gelu, "torch.gelu"), "silu": (silu, "torch.silu"),
    "cross_entropy": (cross_entropy, "torch.cross_entropy"), "embedding": (embedding, "torch.embedding"),
    "linear": (linear, "torch.linear"),
}


def op_kernels(priority: int = 10) -> list[hal.OpKernel]:
    return [hal.OpKernel(op, fn, priority=priority, name=label) for op, (fn, label) in KERNELS.items()]
