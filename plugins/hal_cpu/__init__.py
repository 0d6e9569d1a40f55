"""hal_cpu: the reference plugin. The host CPU as a chip: torch CPU kernels, gloo (or shm) as its CCL."""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.nn.functional as F

import hal
from hal.emulation import cpu_ccl, cpu_fabric_capabilities, create_cpu_process_group
from hal.ops.reference import adamw_step

from .profile import cpu_profile

__version__ = "0.1.0"

CHIP = hal.ChipSpec(name="cpu", vendor="generic", torch_device_type="cpu", ccl_backend="gloo",
                    ccl_name="gloo", visible_devices_env=None,
                    description="host CPU; the reference chip every other plugin is checked against")


@hal.hookimpl
def hal_plugin_info():
    return hal.PluginInfo(name="cpu", version=__version__, contract_version=hal.CONTRACT_VERSION,
                          description="reference plugin: host CPU, torch CPU kernels, gloo CCL")


@hal.hookimpl
def hal_chips():
    return [CHIP]


@hal.hookimpl
def hal_native_available(chip):
    return chip == "cpu"


@hal.hookimpl
def hal_chip_profile(chip, model):
    return cpu_profile(model)


@hal.hookimpl
def hal_device_runtime(chip):
    return hal.CpuRuntime()


@hal.hookimpl
def hal_create_process_group(chip, store, rank, world_size, timeout: timedelta):
    return create_cpu_process_group(store, rank, world_size, timeout)


@hal.hookimpl
def hal_collective_capabilities(chip):
    return cpu_fabric_capabilities(cpu_ccl())


def _sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None):
    # torch's fused CPU kernel: same semantics as the reference, including zeros for a fully masked
    # row (checked by the golden's fully_masked_row case). torch refuses a mask together with
    # is_causal, so that combination takes the reference.
    if attn_mask is None or not is_causal:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale)
    from hal.ops.reference import scaled_dot_product_attention
    return scaled_dot_product_attention(q, k, v, attn_mask, is_causal, scale)


def _adamw_fused(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps, weight_decay):
    # torch's fused AdamW (CPU kernel since torch 2.4): one pass per tensor, math in float32 for
    # 16-bit tensors like the reference (the foreach path computes in float16 and gives inf there).
    # `adamw` adds 1 to each step tensor before use, hence step - 1. torch 2.13's fused CPU kernel
    # silently gives wrong values on strided views (x[:, ::2]; found by tests/test_ops.py), so a
    # call with any non-contiguous tensor takes the reference path.
    if not all(t.is_contiguous() for ts in (params, grads, exp_avgs, exp_avg_sqs) for t in ts):
        return adamw_step(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps, weight_decay)
    with torch.no_grad():
        steps = [torch.tensor(float(step - 1)) for _ in params]
        torch.optim._functional.adamw(list(params), list(grads), list(exp_avgs), list(exp_avg_sqs), [],
                                      steps, fused=True, amsgrad=False, beta1=beta1, beta2=beta2,
                                      lr=lr, weight_decay=weight_decay, eps=eps, maximize=False)


def _layer_norm(x, weight, bias, eps=1e-5):
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def _rms_norm(x, weight, eps=1e-6):
    return F.rms_norm(x, x.shape[-1:], weight, eps)


def _softmax(x, dim=-1):
    # Accumulate 16-bit inputs in float32 like the reference; float64 stays float64.
    return torch.softmax(x, dim, dtype=torch.promote_types(x.dtype, torch.float32)).to(x.dtype)


def _gelu(x, approximate="none"):
    return F.gelu(x, approximate=approximate)


def _silu(x):
    return F.silu(x)


def _cross_entropy(logits, target, ignore_index=-100, reduction="mean"):
    acc = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if reduction != "mean":
        return F.cross_entropy(acc, target, ignore_index=ignore_index, reduction=reduction).to(logits.dtype)
    # torch's mean over zero kept targets is 0/0 = NaN; the reference's (and ours) is 0.
    total = F.cross_entropy(acc, target, ignore_index=ignore_index, reduction="sum")
    return (total / (target != ignore_index).sum().clamp(min=1)).to(logits.dtype)


def _embedding(ids, weight):
    return F.embedding(ids, weight)


def _linear(x, weight, bias=None):
    return F.linear(x, weight, bias)


@hal.hookimpl
def hal_op_kernels(chip, emulated):
    # torch's fused CPU kernels run on CPU tensors, so they serve the cpu chip and every emulated
    # chip alike (an emulated chip's tensors live on the host).
    if chip != "cpu" and not emulated:
        return None
    return [hal.OpKernel(op, fn, priority=1, name=f"torch.{op}") for op, fn in (
        ("linear", _linear), ("layer_norm", _layer_norm), ("rms_norm", _rms_norm), ("softmax", _softmax),
        ("gelu", _gelu), ("silu", _silu), ("cross_entropy", _cross_entropy), ("embedding", _embedding),
        ("scaled_dot_product_attention", _sdpa), ("adamw_step", _adamw_fused))]
