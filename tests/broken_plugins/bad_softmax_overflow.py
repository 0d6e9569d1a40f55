"""Broken plugin: softmax without subtracting the row maximum.

exp(x) / sum(exp(x)) is right for logits of order 1 (every golden case before this suite covered
the dtype's range) and NaN once a logit passes ~88 in float32: attention scores and logits do.
"""
import torch

import hal

from ._base import install

BUG = "softmax overflows for large logits (no max subtraction)"
CAUGHT_BY = "ops.softmax.float32"
LEVELS = ["ops"]
SELECT = ["ops.softmax.float32", "ops.silu.float32"]
STILL_PASSES = ["ops.silu.float32"]
MESSAGE = ["range"]


def softmax(x, dim=-1):
    e = torch.exp(x.float())  # the bug: no x - max
    return (e / e.sum(dim, keepdim=True)).to(x.dtype)


install(globals(), "bad_softmax_overflow", BUG,
        kernels=lambda: [hal.OpKernel("softmax", softmax, priority=10, name="naive_softmax")])
