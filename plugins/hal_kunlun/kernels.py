"""Op overrides on Kunlun XPUs: torch.nn.functional's single ops, which KunlunXin's build dispatches
to its own kernels (one kernel where the HAL reference chains several elementwise ops).

No vendor-specific fused kernel is offered: KunlunXin's fused ops (kunlun_ops, xtorch_ops in
vLLM-Kunlun) are inference kernels with their own conventions, and we have not checked them against
the HAL semantics on hardware. Attention and AdamW keep the reference until that is done.
"""
from __future__ import annotations

import hal
from hal.ops.torch_kernels import torch_kernels

# torch.nn.functional single ops (shared with the other plugins in hal.ops.torch_kernels).
OPS = ("rms_norm", "layer_norm", "softmax", "gelu", "silu", "cross_entropy", "embedding", "linear")


def op_kernels(priority: int = 10) -> list[hal.OpKernel]:
    return torch_kernels(priority, OPS)
