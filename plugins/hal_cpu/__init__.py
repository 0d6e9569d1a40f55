"""hal_cpu: the reference plugin. The host CPU as a chip: torch CPU kernels, gloo (or shm) as its CCL."""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.nn.functional as F

import hal
from hal.emulation import cpu_ccl, cpu_fabric_capabilities, create_cpu_process_group

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
    # torch's fused CPU kernel. Same semantics as the reference except a fully masked row: the
    # reference gives zeros there, torch NaN; only route here when that cannot happen.
    if attn_mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)
    from hal.ops.reference import scaled_dot_product_attention
    return scaled_dot_product_attention(q, k, v, attn_mask, is_causal, scale)


def _adamw_foreach(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps, weight_decay):
    # torch's multi-tensor (foreach) AdamW: one kernel launch per op over all tensors.
    with torch.no_grad():
        steps = [torch.tensor(float(step - 1)) for _ in params]
        torch.optim._functional.adamw(list(params), list(grads), list(exp_avgs), list(exp_avg_sqs), [],
                                      steps, foreach=True, amsgrad=False, beta1=beta1, beta2=beta2,
                                      lr=lr, weight_decay=weight_decay, eps=eps, maximize=False)


def _layer_norm(x, weight, bias, eps=1e-5):
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def _rms_norm(x, weight, eps=1e-6):
    return F.rms_norm(x, x.shape[-1:], weight, eps)


def _softmax(x, dim=-1):
    return torch.softmax(x, dim, dtype=torch.float32).to(x.dtype)


def _gelu(x, approximate="none"):
    return F.gelu(x, approximate=approximate)


def _silu(x):
    return F.silu(x)


def _cross_entropy(logits, target, ignore_index=-100, reduction="mean"):
    return F.cross_entropy(logits.float(), target, ignore_index=ignore_index,
                           reduction=reduction).to(logits.dtype)


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
        ("scaled_dot_product_attention", _sdpa), ("adamw_step", _adamw_foreach))]
