"""Broken plugin: its fused rms_norm reads the input's storage as if it were contiguous (the kernel
takes a data pointer and the shape, not the strides), so it is right for contiguous input and
wrong for a strided view such as x[..., ::2] or a transpose."""
import torch

import hal

from ._base import install

BUG = "rms_norm override ignores strides (wrong for non-contiguous input only)"
CAUGHT_BY = "ops.rms_norm.float32"
LEVELS = ["ops"]
SELECT = ["ops.rms_norm.float32", "ops.reference.rms_norm.float32", "ops.layer_norm.float32"]
STILL_PASSES = ["ops.reference.rms_norm.float32", "ops.layer_norm.float32"]


def _contiguous_strides(shape):
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def _as_if_contiguous(t):
    return t.as_strided(t.shape, _contiguous_strides(t.shape), t.storage_offset())  # the bug


def rms_norm(x, weight, eps=1e-6):
    xf = _as_if_contiguous(x).float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * _as_if_contiguous(weight).float()).to(x.dtype)


install(globals(), "bad_noncontig_op", BUG, kernels=lambda: [hal.OpKernel("rms_norm", rms_norm, priority=10,
                                                                             name="fused_rms_norm")])
