"""Broken plugin: its rms_norm kernel has no `eps` parameter (the vendor hard-coded it), so
hal.ops.rms_norm(x, w, eps) fails with a TypeError on this chip (and silently uses another eps
where eps is not passed)."""
import torch

import hal

from ._base import install

BUG = "rms_norm kernel signature lacks eps"
CAUGHT_BY = "contract.op_kernels"
LEVELS = ["contract", "ops"]
SELECT = ["contract.", "ops.rms_norm.float32"]
STILL_PASSES = ["contract.registers", "contract.hooks"]
ALSO_FAILS = ["ops.rms_norm.float32"]


def rms_norm(x, weight):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()).to(x.dtype)


install(globals(), "bad_kernel_signature", BUG, kernels=lambda: [hal.OpKernel("rms_norm", rms_norm, priority=10)])
