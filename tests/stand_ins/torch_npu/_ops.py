"""torch_npu's fused ops as documented, in plain torch on CPU, with the documented input checks.

Signatures: Ascend/op-plugin @ 517f2e7d op_plugin/config/op_plugin_functions.yaml. Semantics:
docs/zh/custom_APIs/torch_npu/torch_npu-npu_fusion_attention.md, torch_npu-npu_rotary_mul.md,
(beta)torch_npu-npu_rms_norm.md, (beta)torch_npu-npu_swiglu.md, and the decompositions torch_npu
itself registers (Ascend/pytorch @ 9e73e708 torch_npu/_inductor/decomposition.py). A fully masked
attention row gives NaN here: the real kernel's output there is undocumented, so a plugin must not
rely on it. The docs (torch_npu-npu_fusion_attention.md, inner_precise) ask for inner_precise=2
("invalid-row computation") when a row is fully masked, to avoid losing precision; the record keeps
inner_precise so tests can check the adapter asks for it exactly then (it costs speed otherwise).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ._state import STATE

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def npu_rms_norm(self: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-06):
    STATE.record.record("npu_rms_norm", self, gamma, epsilon=epsilon)
    if not 2 <= self.dim() <= 8:
        raise RuntimeError(f"npu_rms_norm: self must have 2-8 dims, got {self.dim()}")
    n = gamma.dim()
    if tuple(self.shape[-n:]) != tuple(gamma.shape):
        raise RuntimeError(f"npu_rms_norm: gamma shape {tuple(gamma.shape)} != self tail {tuple(self.shape[-n:])}")
    x = self.float()
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + epsilon)
    return (x * rstd * gamma.float()).to(self.dtype), rstd


def npu_fusion_attention(query, key, value, head_num, input_layout, pse=None, padding_mask=None,
                         atten_mask=None, scale=1.0, keep_prob=1.0, pre_tockens=2147483647,
                         next_tockens=2147483647, inner_precise=0, prefix=None, actual_seq_qlen=None,
                         actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True, sync=False,
                         softmax_layout="", sink=None, dropout_mask=None, seed=0, offset=0):
    STATE.record.record("npu_fusion_attention", query, key, value, head_num, input_layout, atten_mask=atten_mask,
                        scale=scale, keep_prob=keep_prob, sparse_mode=sparse_mode, pse=pse,
                        pre_tockens=pre_tockens, next_tockens=next_tockens, inner_precise=inner_precise)
    STATE.last_atten_mask = atten_mask
    if input_layout != "BNSD":
        raise NotImplementedError(f"stand-in implements input_layout BNSD only, got {input_layout!r}")
    if not query.dtype == key.dtype == value.dtype or query.dtype not in _FLOATS:
        raise RuntimeError("npu_fusion_attention: query/key/value must share a float16/bfloat16/float32 dtype")
    b, n, sq, d = query.shape
    sk = key.size(2)
    if n != head_num:
        raise RuntimeError(f"npu_fusion_attention: head_num {head_num} != N {n} of query (BNSD)")
    scores = torch.matmul(query.float(), key.float().transpose(-2, -1)) * scale
    masked = torch.zeros(sq, sk, dtype=torch.bool)
    if atten_mask is not None:
        if atten_mask.dtype not in (torch.bool, torch.uint8):
            raise RuntimeError(f"npu_fusion_attention: atten_mask must be bool or uint8, got {atten_mask.dtype}")
        if sparse_mode == 0:
            shape = tuple(atten_mask.shape)
            if shape not in ((sq, sk), (1, 1, sq, sk), (b, 1, sq, sk), (b, n, sq, sk)):
                raise RuntimeError(f"npu_fusion_attention: atten_mask shape {shape} is not SS/11SS/B1SS/BNSS")
            masked = atten_mask.bool()
        elif sparse_mode == 2:  # leftUpCausal: the 2048x2048 compressed mask stands for the triangle
            if tuple(atten_mask.shape) != (2048, 2048):
                raise RuntimeError("npu_fusion_attention: sparse_mode 2 needs the 2048x2048 compressed mask")
            masked = torch.ones(sq, sk, dtype=torch.bool).triu(diagonal=1)
        else:
            raise NotImplementedError(f"stand-in implements sparse_mode 0 and 2, got {sparse_mode}")
    scores = scores.masked_fill(masked, float("-inf"))
    probs = torch.softmax(scores, dim=-1)  # NaN on fully masked rows
    out = torch.matmul(probs, value.float()).to(query.dtype)
    smax = scores.amax(-1, keepdim=True)
    return out, smax, probs.sum(-1, keepdim=True), torch.empty(0), 0, 0, 0


def npu_rotary_mul(self: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, rotary_mode: str = "half",
                   rotate: Optional[torch.Tensor] = None) -> torch.Tensor:
    STATE.record.record("npu_rotary_mul", self, r1, r2, rotary_mode=rotary_mode, rotate=rotate)
    if self.dim() not in (3, 4) or r1.dim() not in (3, 4) or r2.dim() not in (3, 4):
        raise RuntimeError("npu_rotary_mul: input, r1 and r2 must be 3-D or 4-D")
    if rotary_mode != "half":
        raise NotImplementedError(f"stand-in implements rotary_mode 'half' only, got {rotary_mode!r}")
    x = self.float()  # 16-bit inputs computed in float32 and cast back (an assumption of the stand-in)
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return (x * r1.float() + torch.cat((-x2, x1), dim=-1) * r2.float()).to(self.dtype)


def npu_swiglu(self: torch.Tensor, dim: int = -1) -> torch.Tensor:
    STATE.record.record("npu_swiglu", self, dim=dim)
    if not self.is_contiguous():
        raise RuntimeError("npu_swiglu: non-contiguous input is not supported")
    a, b = torch.chunk(self.float(), 2, dim=dim)
    return (F.silu(a) * b).to(self.dtype)
