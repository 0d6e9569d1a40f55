"""Stand-in for Huawei's torch_npu, following Ascend/pytorch master @ 9e73e708 (torch 2.13-2.15 line).

At import, like torch_npu/_init/registry/backend.py: `torch.utils.rename_privateuse1_backend("npu")`
and `torch._register_device_module("npu", torch_npu.npu)`. Exposes the fused ops with the signatures
of Ascend/op-plugin op_plugin/config/op_plugin_functions.yaml (@517f2e7d), computed in plain torch
on CPU, and `_C._distributed_c10d.ProcessGroupHCCL` with its Options. Every call is recorded in
`torch_npu._state.STATE.record`.
"""
from __future__ import annotations

import torch

from . import _C, npu
from ._ops import npu_fusion_attention, npu_rms_norm, npu_rotary_mul, npu_swiglu
from ._state import STATE

# torch_npu is built for exactly one torch (its version is that torch's): the stand-in pairs with the torch it runs on
__version__ = torch.__version__.split("+")[0] + ".stand-in"
__all__ = ["npu", "npu_fusion_attention", "npu_rms_norm", "npu_rotary_mul", "npu_swiglu", "STATE", "_C"]

if torch._C._get_privateuse1_backend_name() != "npu":
    torch.utils.rename_privateuse1_backend("npu")
if not hasattr(torch, "npu"):
    torch._register_device_module("npu", npu)
