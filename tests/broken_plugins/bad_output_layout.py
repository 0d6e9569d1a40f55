"""Broken plugin: the matmul override returns a column-major result.

The vendor's GEMM writes column-major (Fortran) output and the plugin wraps it with `.t()`: the
values are right, but the tensor is not contiguous where torch's matmul is, so model code's
`.view()` on it fails and every later kernel pays a copy.
"""
import torch

import hal

from ._base import install

BUG = "matmul override returns a transposed (column-major) view for contiguous inputs"
CAUGHT_BY = "ops.matmul.float32"
LEVELS = ["ops"]
SELECT = ["ops.matmul.float32", "ops.linear.float32"]
STILL_PASSES = ["ops.linear.float32"]
MESSAGE = ["contiguous"]


def matmul(a, b):
    if a.dim() != 2 or b.dim() != 2:
        return torch.matmul(a, b)
    return torch.matmul(b.t(), a.t()).contiguous().t()  # the bug: column-major output


install(globals(), "bad_output_layout", BUG,
        kernels=lambda: [hal.OpKernel("matmul", matmul, priority=10, name="colmajor_matmul")])
