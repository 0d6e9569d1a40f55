"""Op overrides for NVIDIA GPUs: torch's fused CUDA paths, adapted to the HAL op semantics.

- scaled_dot_product_attention -> F.scaled_dot_product_attention, which picks the flash,
  memory-efficient or cuDNN kernel on CUDA. Same mask conventions as the HAL (bool True = attend,
  float = additive, is_causal top-left aligned); torch refuses attn_mask together with is_causal, so
  the causal triangle is folded into the mask; rows with no key to attend to are zeroed (torch gives
  NaN there, the HAL reference zeros).
- adamw_step -> torch's fused AdamW (`fused=True`, one kernel for all tensors); the step counters
  live on the device as torch.optim.AdamW keeps them for the fused path.
- rms_norm, layer_norm, softmax, gelu, silu, cross_entropy, embedding, linear -> torch.nn.functional,
  one CUDA kernel each instead of the reference's chain of elementwise ops.
The kernels live in `hal.ops.torch_kernels` (shared with the other plugins whose torch builds run them);
they need only torch, so the unit tests run them on CPU tensors against the reference.
"""
from __future__ import annotations

import hal
from hal.ops.torch_kernels import KERNELS, adamw_step, scaled_dot_product_attention, torch_kernels

__all__ = ["KERNELS", "adamw_step", "scaled_dot_product_attention", "op_kernels"]


def op_kernels(priority: int = 10) -> list[hal.OpKernel]:
    return torch_kernels(priority)
