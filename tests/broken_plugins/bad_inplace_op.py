"""Broken plugin: the silu override works in place on its input and returns it.

Saves a buffer (x.mul_(sigmoid(x))): the output is right, but the caller's activation, which
autograd or a residual connection still needs, now holds the output.
"""
import torch

import hal

from ._base import install

BUG = "silu override overwrites its input"
CAUGHT_BY = "ops.silu.float32"
LEVELS = ["ops"]
SELECT = ["ops.silu.float32", "ops.gelu.float32"]
STILL_PASSES = ["ops.gelu.float32"]
MESSAGE = ["input", "changed"]


def silu(x):
    return x.mul_(torch.sigmoid(x))  # the bug: in place


install(globals(), "bad_inplace_op", BUG, kernels=lambda: [hal.OpKernel("silu", silu, priority=10, name="inplace_silu")])
