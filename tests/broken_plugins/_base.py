"""Scaffolding for deliberately broken plugins: a CPU-backed chip with one injected bug.

Each broken plugin claims its own chip name and is *native* (its probe says True, its runtime is a
`hal.CpuRuntime`), so the HAL calls its hooks as it would a vendor's on real hardware: the
process group comes from its `hal_create_process_group` (an emulated chip would get the HAL's CPU
fabric instead, and the bug would never be reached). A process-group bug is injected by wrapping the
gloo group in `GroupProxy` and overriding one method; a runtime bug by subclassing `CpuRuntime`.

A broken plugin module says what should catch it (read by tests/test_conformance_broken.py):
    BUG = "what is wrong, in one line"
    CAUGHT_BY = "the check id that must fail"
    LEVELS = [...]; SELECT = [...]        # the smallest run that reaches the check
    STILL_PASSES = [...]                  # checks that must pass (the bug is specific)
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable, Optional

import torch.distributed as dist

import hal
from hal.emulation import cpu_fabric_capabilities


class GroupProxy:
    """A gloo group with every method passed through; subclasses override the broken one."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class DoneWork:
    """A work object that is already 'complete' (what a buggy plugin returns)."""

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True


def cpu_profile_for(chip: str, **overrides: Any) -> hal.ChipProfile:
    from hal_cpu.profile import cpu_profile
    prof = cpu_profile()
    data = prof.model_dump()
    data.update(chip=chip, model=f"{chip} test chip (CPU-backed)", **overrides)
    return hal.ChipProfile(**data)


def install(namespace: dict, chip: str, bug: str, *,
            runtime: Callable[[], hal.DeviceRuntime] = hal.CpuRuntime,
            wrap_group: Optional[Callable[[Any], Any]] = None,
            capabilities: Optional[hal.CapabilityMatrix] = None,
            profile: Optional[Callable[[], hal.ChipProfile]] = None,
            kernels: Optional[Callable[[], list]] = None) -> None:
    """Define the hook implementations of a CPU-backed chip `chip` as module globals of `namespace`."""
    spec = hal.ChipSpec(name=chip, vendor="conformance test", torch_device_type="cpu", ccl_backend="gloo",
                        ccl_name="gloo (wrapped)", description=f"deliberately broken: {bug}")

    @hal.hookimpl
    def hal_plugin_info():
        return hal.PluginInfo(name=chip, version="0.0.1", contract_version=hal.CONTRACT_VERSION,
                              description=f"deliberately broken test plugin: {bug}")

    @hal.hookimpl
    def hal_chips():
        return [spec]

    @hal.hookimpl
    def hal_native_available(chip):
        return chip == spec.name

    @hal.hookimpl
    def hal_chip_profile(chip, model):
        return profile() if profile else cpu_profile_for(spec.name)

    @hal.hookimpl
    def hal_device_runtime(chip):
        return runtime()

    @hal.hookimpl
    def hal_create_process_group(chip, store, rank, world_size, timeout: timedelta):
        pg = dist.ProcessGroupGloo(store, rank, world_size, timeout)
        return wrap_group(pg) if wrap_group else pg

    @hal.hookimpl
    def hal_collective_capabilities(chip):
        if capabilities is not None:
            return capabilities
        gloo = cpu_fabric_capabilities("gloo")
        return hal.CapabilityMatrix(chip=spec.name, entries=gloo.entries, source=f"gloo, wrapped: {gloo.source}")

    hooks = dict(hal_plugin_info=hal_plugin_info, hal_chips=hal_chips, hal_native_available=hal_native_available,
                 hal_chip_profile=hal_chip_profile, hal_device_runtime=hal_device_runtime,
                 hal_create_process_group=hal_create_process_group,
                 hal_collective_capabilities=hal_collective_capabilities)
    if kernels is not None:
        @hal.hookimpl
        def hal_op_kernels(chip, emulated):
            return kernels() if chip == spec.name else None
        hooks["hal_op_kernels"] = hal_op_kernels
    namespace.update(hooks)
