"""hal_cuda: NVIDIA GPUs through torch.cuda and NCCL (torch backend `nccl`).

Chip `cuda`: torch device type `cuda`, CCL backend `nccl`, visible devices `CUDA_VISIBLE_DEVICES`.
Native only on a CUDA build of torch with a GPU visible and no KunlunXin adapter installed (see
`probe`). Profiles come from the HAL catalog by device name (A100/H100/H800/H20 ...), anything else
gets a profile of unknowns. Op overrides are torch's fused CUDA paths (`hal.sdk.torch_kernels`:
flash / memory-efficient / cuDNN attention, fused AdamW, one kernel per torch.nn.functional op),
offered only when native. hal_kunlun's chip subclasses `CudaChip`.
"""
from __future__ import annotations

import torch

from hal import sdk

from .nccl import create_nccl_process_group, nccl_capabilities, nccl_version
from .probe import probe
from .runtime import CudaRuntime

__version__ = "0.1.0"
__all__ = ["CHIP", "CudaChip", "PLUGIN", "probe", "CudaRuntime", "nccl_capabilities"]


class CudaChip(sdk.Chip):
    """NVIDIA GPUs: torch.cuda's runtime, ProcessGroupNCCL, torch's CUDA kernels."""

    spec = sdk.ChipSpec(name="cuda", vendor="NVIDIA", torch_device_type="cuda", ccl_backend="nccl",
                        ccl_name="NCCL", visible_devices_env="CUDA_VISIBLE_DEVICES",
                        description="NVIDIA GPUs via torch.cuda and NCCL")
    version = __version__
    description = "NVIDIA GPUs: torch.cuda runtime, NCCL process groups"
    runtime_class = CudaRuntime
    # dtypes a model missing from the catalog lists as unknown; ops offered as kernels (None: all)
    profile_dtypes: tuple[str, ...] = ("float32", "tf32", "bfloat16", "float16")
    kernel_ops = None

    def probe(self, bind=False):
        return probe()

    def profile(self, model):
        return sdk.profile_for(self.name, model, self.profile_dtypes)

    def device_runtime(self):
        return self.runtime_class(torch.cuda, "cuda")

    def create_process_group(self, store, rank, world_size, timeout, global_ranks, group_name):
        return create_nccl_process_group(store, rank, world_size, timeout, global_ranks, group_name, chip=self.name)

    def collective_capabilities(self):
        # Read the NCCL version and the compute capability only once CUDA is initialised (at bind);
        # at validation the conservative matrix (no float8 reductions) is given.
        cc = None
        try:
            if torch.cuda.is_initialized():
                cc = tuple(torch.cuda.get_device_capability())
        except Exception:
            cc = None
        return nccl_capabilities(self.name, nccl_version() if cc else None, cc)

    def op_kernels(self, emulated):
        # Emulated chips run on CPU tensors: hal_cpu's kernels serve them.
        return None if emulated else sdk.torch_kernels(10, self.kernel_ops)


CHIP = CudaChip.spec
PLUGIN = sdk.plugin(CudaChip)
globals().update(PLUGIN.hookimpls())  # the entry point names this module: pluggy finds the hooks here
