"""Op overrides for Ascend NPUs: torch_npu's fused kernels, adapted to the HAL op signatures.

Signatures as Ascend/op-plugin declares them (op_plugin/config/op_plugin_functions.yaml and
docs/zh/custom_APIs/torch_npu/*.md, commit 517f2e7d):
  npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor y, Tensor rstd)
  npu_fusion_attention(query, key, value, int head_num, str input_layout, pse=None, padding_mask=None,
      atten_mask=None, float scale=1., float keep_prob=1., int pre_tockens=2147483647,
      int next_tockens=2147483647, int inner_precise=0, ..., int sparse_mode=0, ...)
      -> (attention_out, softmax_max, softmax_sum, softmax_out, seed, offset, numels)
      atten_mask: True/1 = position does NOT take part (the opposite of torch's bool mask);
      scale defaults to 1 (not 1/sqrt(D)); sparse_mode 2 = leftUpCausal with a compressed
      2048x2048 upper-triangular mask; mask shapes BNSS, B1SS, 11SS or SS.
  npu_rotary_mul(Tensor self, Tensor r1, Tensor r2, str rotary_mode='half', Tensor? rotate=None)
      half mode: x * r1 + rotate_half(x) * r2 == the HAL's rotary_embedding(x, cos, sin).
  npu_swiglu(Tensor self, int dim=-1) -> Tensor: silu(first half) * second half; needs contiguous input.
  npu_fusion_attention's inner_precise=2 turns on invalid-row computation for fully masked rows
  (the doc: "2为开启无效行计算，其功能是避免在计算过程中存在整行mask进而导致精度有损失").
  adamw_step: torch's `_fused_adamw_` -> op-plugin FusedAdamWKernelNpuOpApi.cpp -> aclnnApplyAdamWV2,
  offered only on A2/A3 for float16/bfloat16/float32 (`make_adamw`).
Each adapter checks the documented constraints (dtypes, ranks, shape patterns, products) and falls
back to the HAL reference kernel outside them, so an override never changes the op's meaning.
"""
from __future__ import annotations

import math
import re
from typing import Any, Callable, Optional

import torch

from hal import sdk

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
# npu_rms_norm (self, gamma) dtype pairs per product family (npu_rms_norm.md).
_RMS_PAIRS_A2 = {(torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float16, torch.float16),
                 (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32)}
_RMS_PAIRS_OLD = {(torch.float16, torch.float16), (torch.float32, torch.float32)}
FA_COMPRESSED_MASK = 2048
FA_MAX_HEAD_DIM = 768
ROTARY_MAX_HEAD_DIM = 896  # "D < 896 and even" (jit_compile=False, Atlas A2/A3)
ROTARY_MAX_BN = 1000


def product_family(device_name: str) -> str:
    """'A2' (Ascend910B*), 'A3' (Ascend910_93*), '950', 'training' (Ascend910 A/Pro) or 'other'.
    Names as torch_npu reports them; torch_npu/distributed/distributed_c10d.py compares them the same
    way ("Ascend910B1".."Ascend910B4_1", "Ascend910_9362".."Ascend910_9392")."""
    if re.match(r"Ascend910B", device_name):
        return "A2"
    if re.match(r"Ascend910_93", device_name):
        return "A3"
    if re.match(r"Ascend950", device_name):
        return "950"
    if re.match(r"Ascend910", device_name):
        return "training"
    return "other"


def make_rms_norm(npu: Any, family: str) -> Callable:
    pairs = _RMS_PAIRS_A2 if family in ("A2", "A3") else _RMS_PAIRS_OLD

    def rms_norm(x, weight, eps=1e-6):
        if (x.dtype, weight.dtype) not in pairs or not 2 <= x.dim() <= 8 or weight.shape != x.shape[-1:]:
            return sdk.reference.rms_norm(x, weight, eps)
        y, _rstd = npu.npu_rms_norm(x, weight, epsilon=eps)  # rstd is kept for the backward only
        return y
    return rms_norm


def _fa_mask(masked: torch.Tensor, b: int, h: int, sq: int, sk: int) -> torch.Tensor:
    """A broadcastable 'True = masked' tensor in one of the layouts FA accepts: SS, 11SS, B1SS, BNSS."""
    m = masked
    while m.dim() < 4:
        m = m.unsqueeze(0)
    mb, mh = m.shape[0], m.shape[1]
    m = m.expand(mb, mh, sq, sk)
    if mb == 1 and mh == 1:
        return m[0, 0].contiguous()  # SS
    if mh == 1:
        return m.expand(b, 1, sq, sk).contiguous()  # B1SS
    return m.expand(b, h, sq, sk).contiguous()  # BNSS


def make_sdpa(npu: Any) -> Callable:
    causal_masks: dict[torch.device, torch.Tensor] = {}

    def compressed_causal(device: torch.device) -> torch.Tensor:
        # sparse_mode 2/3/4 take this fixed 2048x2048 mask; built once per device.
        if device not in causal_masks:
            ones = torch.ones(FA_COMPRESSED_MASK, FA_COMPRESSED_MASK, dtype=torch.bool, device=device)
            causal_masks[device] = torch.triu(ones, diagonal=1)
        return causal_masks[device]

    def sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None):
        usable = (q.dim() == 4 and k.dim() == 4 and v.dim() == 4 and q.dtype in _FLOATS
                  and q.dtype == k.dtype == v.dtype and q.shape[:2] == k.shape[:2] == v.shape[:2]
                  and k.shape[-2] == v.shape[-2] and q.size(-1) == k.size(-1) >= v.size(-1)
                  and 1 <= q.size(-1) <= FA_MAX_HEAD_DIM
                  and (attn_mask is None or attn_mask.dtype == torch.bool))
        if not usable:  # float (additive) masks and odd shapes keep the reference
            return sdk.reference.scaled_dot_product_attention(q, k, v, attn_mask, is_causal, scale)
        b, h, sq, d = q.shape
        sk = k.size(-2)
        scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
        dead = None
        if attn_mask is None:
            mask, mode = (compressed_causal(q.device), 2) if is_causal else (None, 0)
        else:
            allowed = attn_mask
            if is_causal:
                allowed = allowed & torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril()
            mask, mode = _fa_mask(~allowed, b, h, sq, sk), 0
            dead = ~allowed.any(-1, keepdim=True)  # rows with no key: the HAL gives zeros
        # Fully masked rows: the doc's inner_precise=2 ("开启无效行计算", invalid-row computation)
        # avoids the precision loss such rows cause; it costs speed, so only when a row is dead.
        # (One host sync to ask; the reference path costs far more.)
        any_dead = dead is not None and bool(dead.any())
        out = npu.npu_fusion_attention(q, k, v, h, "BNSD", atten_mask=mask, scale=scale, keep_prob=1.0,
                                       sparse_mode=mode, inner_precise=2 if any_dead else 0)[0]
        return out.masked_fill(dead, 0.0) if any_dead else out
    return sdpa


def _rotary_bn(x_shape: torch.Size, r_shape: torch.Size) -> Optional[tuple[int, int]]:
    """(B, N) if cos/sin's shape is one the half mode accepts for x (11SD/B1SD/BNSD for BNSD,
    1S1D/BS1D for BSND, S11D/SB1D for SBND), else None."""
    full = []
    for xs, rs in zip(x_shape[:3], r_shape[:3]):
        if rs != xs and rs != 1:
            return None
        full.append(rs == xs)
    pattern = tuple(full)
    s_dim = {(False, False, True): 2, (True, False, True): 2, (True, True, True): 2,
             (False, True, False): 1, (True, True, False): 1, (True, False, False): 0}.get(pattern)
    if s_dim is None:
        return None
    b, n = (x_shape[i] for i in range(3) if i != s_dim)
    return b, n


def make_rotary(npu: Any) -> Callable:
    def rotary_embedding(x, cos, sin):
        bn = None
        if (x.dim() == 4 and cos.dim() == 4 and cos.shape == sin.shape and x.dtype in _FLOATS
                and cos.dtype == sin.dtype == x.dtype and cos.shape[-1] == x.shape[-1]
                and x.shape[-1] % 2 == 0 and x.shape[-1] < ROTARY_MAX_HEAD_DIM):
            bn = _rotary_bn(x.shape, cos.shape)
        if bn is None or max(bn) >= ROTARY_MAX_BN:
            return sdk.reference.rotary_embedding(x, cos, sin)
        return npu.npu_rotary_mul(x, cos, sin, rotary_mode="half")
    return rotary_embedding


def make_swiglu(npu: Any) -> Callable:
    def swiglu(x, dim=-1):
        if x.dtype not in _FLOATS or not 1 <= x.dim() <= 8 or x.numel() == 0 or x.size(dim) % 2:
            return sdk.reference.swiglu(x, dim)
        return npu.npu_swiglu(x.contiguous(), dim=dim)  # "does not support non-contiguous tensors"
    return swiglu


def family_of(device_name: str, soc_version: Optional[int] = None) -> str:
    """The product family from the SoC version when known (NpuVariables.h: 220-225 A2, 250-256 A3,
    260 Ascend950, 100-104 Atlas training series), else from the device name."""
    if soc_version is not None and soc_version >= 0:
        v = int(soc_version)
        return "A2" if 220 <= v <= 225 else "A3" if 250 <= v <= 256 else "950" if v >= 260 else \
            "training" if 100 <= v <= 104 else "other"
    return product_family(device_name)


ADAMW_FAMILIES = ("A2", "A3")
_ADAMW_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def make_adamw(family: str, fused: Optional[Callable] = None) -> Optional[Callable]:
    """torch's fused AdamW, which torch_npu dispatches to op-plugin's `_fused_adamw_`
    (op_plugin/ops/opapi/FusedAdamWKernelNpuOpApi.cpp @517f2e7d: one aclnnApplyAdamWV2 per tensor),
    where that aclnn op exists: Atlas A2/A3 (the ApplyAdamWV2 operator doc lists the A2 training
    series; A3 shares its operator library), var/m/v/grad of one dtype among float16, bfloat16,
    float32 ("输入张量中varRef、mRef、vRef的数据类型一致时，数据类型支持FLOAT16、BFLOAT16、FLOAT32").
    Elsewhere (910A, Ascend 950, other dtypes, mixed dtypes) None / the HAL reference. `fused`
    defaults to the HAL's torch fused AdamW (`sdk.TORCH_KERNELS["adamw_step"]`)."""
    if family not in ADAMW_FAMILIES:
        return None
    fused = fused or sdk.TORCH_KERNELS["adamw_step"][0]

    def adamw_step(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps, weight_decay):
        params = list(params)
        tensors = [t for ts in (params, grads, exp_avgs, exp_avg_sqs) for t in ts]
        dtypes = {t.dtype for t in tensors}
        if len(dtypes) != 1 or next(iter(dtypes), None) not in _ADAMW_DTYPES:
            return sdk.reference.adamw_step(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps,
                                            weight_decay)
        return fused(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps, weight_decay)
    return adamw_step


def op_kernels(npu: Any, device_name: str, soc_version: Optional[int] = None,
               priority: int = 10) -> list[sdk.OpKernel]:
    """Kernels for the product `device_name` / `soc_version` names; fused ones only where the docs
    list the product."""
    family = family_of(device_name, soc_version)
    out = [("rms_norm", make_rms_norm(npu, family), "torch_npu.npu_rms_norm")]
    if family in ("A2", "950"):  # npu_fusion_attention: Atlas A2 and Ascend 950 per its doc
        out.append(("scaled_dot_product_attention", make_sdpa(npu), "torch_npu.npu_fusion_attention"))
    if family in ("A2", "A3"):  # npu_rotary_mul half mode without jit compile: A2/A3
        out.append(("rotary_embedding", make_rotary(npu), "torch_npu.npu_rotary_mul"))
    if family == "A2":  # npu_swiglu: Atlas A2 per its doc
        out.append(("swiglu", make_swiglu(npu), "torch_npu.npu_swiglu"))
    adamw = make_adamw(family)
    if adamw is not None:
        out.append(("adamw_step", adamw, "torch._fused_adamw_ (aclnnApplyAdamWV2)"))
    fused = [sdk.OpKernel(op, fn, priority=priority, name=label) for op, fn, label in out]
    # The rest: torch's own ops, which torch_npu dispatches to NPU kernels (shared with the other plugins).
    return fused + sdk.torch_kernels(priority, ("layer_norm", "softmax", "gelu", "silu", "cross_entropy",
                                                "embedding", "linear"))
