"""hal_cpu: the reference plugin. The host CPU as a chip: torch CPU kernels, gloo (or shm) as its CCL."""
from __future__ import annotations

from hal import sdk

from .profile import cpu_profile

__version__ = "0.1.0"
__all__ = ["CHIP", "CpuChip", "PLUGIN", "cpu_profile"]


class CpuChip(sdk.Chip):
    """The host: always present, `CpuRuntime`, the HAL's CPU fabric as its CCL."""

    spec = sdk.ChipSpec(name="cpu", vendor="generic", torch_device_type="cpu", ccl_backend="gloo",
                        ccl_name="gloo", visible_devices_env=None,
                        description="host CPU; the reference chip every other plugin is checked against")
    version = __version__
    description = "reference plugin: host CPU, torch CPU kernels, gloo CCL"

    def probe(self, bind=False):
        return {"native": True, "reason": "the host CPU runs every process"}

    def profile(self, model):
        return cpu_profile(model)

    def device_runtime(self):
        return sdk.CpuRuntime()

    def create_process_group(self, store, rank, world_size, timeout, global_ranks, group_name):
        return sdk.create_cpu_process_group(store, rank, world_size, timeout)

    def collective_capabilities(self):
        return sdk.cpu_fabric_capabilities(sdk.cpu_ccl())

    def op_kernels(self, emulated):
        return sdk.torch_kernels(priority=1)

    def op_kernels_for(self, chip, emulated):
        # torch's fused CPU kernels run on CPU tensors, so they serve every emulated chip too (an
        # emulated chip's tensors live on the host).
        return sdk.torch_kernels(priority=1) if emulated else None


CHIP = CpuChip.spec
PLUGIN = sdk.plugin(CpuChip)
globals().update(PLUGIN.hookimpls())  # the entry point names this module: pluggy finds the hooks here
