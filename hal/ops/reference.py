"""Reference kernels in plain torch: the executable definition of every HAL op.

Readable first: these are what overrides are checked against. Reductions of 16-bit inputs are done
in float32 and cast back, the way fused vendor kernels do it, so tolerances stay tight. float64 stays
float64 (`_acc`): the reference run on float64 copies is the golden the tests compare against.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch


def _acc(t: torch.Tensor) -> torch.Tensor:
    """`t` in its accumulation dtype: float32 for 16/32-bit floats, float64 kept as float64."""
    return t if t.dtype == torch.float64 else t.float()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x (..., in) @ weight (out, in).T + bias (out,) -> (..., out)."""
    y = torch.matmul(x, weight.t())
    return y + bias if bias is not None else y


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Batched matmul with torch.matmul's broadcasting."""
    return torch.matmul(a, b)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x (..., h) / sqrt(mean(x^2, -1) + eps) * weight (h,)."""
    xf = _acc(x)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.to(xf.dtype)).to(x.dtype)


def layer_norm(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
               eps: float = 1e-5) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dim (biased variance)."""
    xf = _acc(x)
    mean = xf.mean(-1, keepdim=True)
    var = (xf - mean).pow(2).mean(-1, keepdim=True)
    y = (xf - mean) * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * weight.to(xf.dtype)
    if bias is not None:
        y = y + bias.to(xf.dtype)
    return y.to(x.dtype)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """exp(x - max) / sum(exp(x - max)) along `dim`, accumulated in float32."""
    xf = _acc(x)
    e = torch.exp(xf - xf.amax(dim, keepdim=True))
    return (e / e.sum(dim, keepdim=True)).to(x.dtype)


def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False,
                                 scale: Optional[float] = None) -> torch.Tensor:
    """q (B, H, Sq, D), k/v (B, H, Sk, D) -> (B, H, Sq, D).

    `attn_mask` is boolean (True = attend) or additive float, broadcastable to (B, H, Sq, Sk).
    `is_causal` masks key j > query i (top-left aligned, like torch). A row with no key to attend
    to gives zeros (as torch 2.13's CPU kernels do; older torch and some fused kernels give NaN, and a
    NaN in training is never what anyone wants).
    """
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    scores = torch.matmul(_acc(q), _acc(k).transpose(-2, -1)) * scale  # (B, H, Sq, Sk)
    allowed = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device)
    if is_causal:
        allowed = torch.ones_like(allowed).tril()
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        allowed = allowed & attn_mask
    elif attn_mask is not None:
        scores = scores + attn_mask.to(scores.dtype)
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return torch.matmul(probs, _acc(v)).to(q.dtype)


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """0.5 x (1 + erf(x / sqrt 2)); with approximate='tanh' the tanh form."""
    xf = _acc(x)
    if approximate == "tanh":
        y = 0.5 * xf * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (xf + 0.044715 * xf.pow(3))))
    elif approximate == "none":
        y = 0.5 * xf * (1.0 + torch.erf(xf / math.sqrt(2.0)))
    else:
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return y.to(x.dtype)


def silu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x)."""
    xf = _acc(x)
    return (xf * torch.sigmoid(xf)).to(x.dtype)


def swiglu(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """x (..., 2n) split in halves a, b along `dim` -> silu(a) * b (..., n); torch_npu's npu_swiglu."""
    if x.shape[dim] % 2:
        raise ValueError(f"swiglu: dim {dim} of shape {tuple(x.shape)} has odd size {x.shape[dim]}; "
                         f"expected 2n (the halves a, b)")
    a, b = _acc(x).chunk(2, dim=dim)
    return (a * torch.sigmoid(a) * b).to(x.dtype)


def rotary_embedding(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, rotate_half([x1, x2]) = [-x2, x1] on the last dim (size D).

    cos/sin broadcast to x, e.g. x (B, S, H, D) with cos (1, S, 1, D). This is torch_npu's
    npu_rotary_mul(x, r1=cos, r2=sin) and the Llama/NeoX convention.
    """
    xf = _acc(x)
    x1, x2 = xf.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return (xf * cos.to(xf.dtype) + rotated * sin.to(xf.dtype)).to(x.dtype)


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
                  reduction: str = "mean") -> torch.Tensor:
    """logits (N, C), target (N,) int -> loss; log-softmax in float32; ignored targets excluded."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"cross_entropy: reduction must be mean, sum or none, got {reduction!r}")
    logp = torch.log_softmax(_acc(logits), dim=-1)
    keep = target != ignore_index
    safe = torch.where(keep, target, torch.zeros_like(target))
    nll = -logp.gather(-1, safe.unsqueeze(-1)).squeeze(-1) * keep
    if reduction == "none":
        return nll.to(logits.dtype)
    total = nll.sum()
    if reduction == "sum":
        return total.to(logits.dtype)
    return (total / keep.sum().clamp(min=1)).to(logits.dtype)


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """ids (...) int -> weight[ids] (..., h)."""
    return weight[ids]


@torch.no_grad()
def adamw_step(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor],
               exp_avgs: Sequence[torch.Tensor], exp_avg_sqs: Sequence[torch.Tensor], step: int,
               lr: float, beta1: float, beta2: float, eps: float, weight_decay: float) -> None:
    """One AdamW step in place (decoupled weight decay, bias correction; `step` counts from 1).

    p <- p (1 - lr wd);  m <- b1 m + (1-b1) g;  v <- b2 v + (1-b2) g^2;
    p <- p - lr / (1 - b1^t) * m / (sqrt(v / (1 - b2^t)) + eps)

    16-bit tensors are updated in float32 and stored back (as torch's fused AdamW does): in float16,
    (1-b2) g^2 underflows to 0 for |g| < ~0.008 and eps=1e-8 rounds to 0, so m / (sqrt(v) + eps)
    would be m / 0 = inf.
    """
    if step < 1:
        raise ValueError(f"adamw_step: step counts from 1, got {step}")
    bc1 = 1.0 - beta1 ** step
    bc2 = 1.0 - beta2 ** step
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
        pf, gf, mf, vf = _acc(p), _acc(g), _acc(m), _acc(v)  # the tensors themselves in fp32/fp64
        pf.mul_(1.0 - lr * weight_decay)
        mf.mul_(beta1).add_(gf, alpha=1.0 - beta1)
        vf.mul_(beta2).addcmul_(gf, gf, value=1.0 - beta2)
        denom = (vf / bc2).sqrt_().add_(eps)
        pf.addcdiv_(mf, denom, value=-lr / bc1)
        for t, tf in ((p, pf), (m, mf), (v, vf)):
            if tf is not t:
                t.copy_(tf)


KERNELS = {name: globals()[name] for name in (
    "linear", "matmul", "rms_norm", "layer_norm", "softmax", "scaled_dot_product_attention", "gelu",
    "silu", "swiglu", "rotary_embedding", "cross_entropy", "embedding", "adamw_step")}
