"""Scaffolding for deliberately broken plugins: a CPU-backed chip with one injected bug.

Each broken plugin claims its own chip name and is *native* (its probe says True, its runtime is a
`hal.CpuRuntime`), so the HAL calls its hooks as it would a vendor's on real hardware: the
process group comes from its `hal_create_process_group` (an emulated chip would get the HAL's CPU
fabric instead, and the bug would never be reached). The group is gloo (with the HAL's staging of
strided views), refusing undeclared combinations with `hal.NotSupportedError` as the hookspec asks
(`TypedRefusals`); a process-group bug is injected by wrapping the gloo group in `GroupProxy` and
overriding one method; a runtime bug by subclassing `CpuRuntime`.

A broken plugin module says what should catch it (read by tests/test_conformance_broken.py):
    BUG = "what is wrong, in one line"
    CAUGHT_BY = "the check id that must fail"
    LEVELS = [...]; SELECT = [...]        # the smallest run that reaches the check
    STILL_PASSES = [...]                  # checks that must pass (the bug is specific)
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

import hal
from hal.emulation.emulate import cpu_fabric_capabilities
from hal.emulation.gloo_group import StridedSafeGloo


class GroupProxy:
    """A gloo group with every method passed through; subclasses override the broken one."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


_METHOD_COLLECTIVE = {"allreduce": "all_reduce", "reduce": "reduce", "reduce_scatter": "reduce_scatter",
                      "_reduce_scatter_base": "reduce_scatter_tensor", "broadcast": "broadcast",
                      "allgather": "all_gather", "_allgather_base": "all_gather_into_tensor",
                      "alltoall": "all_to_all", "alltoall_base": "all_to_all_single", "gather": "gather",
                      "scatter": "scatter", "send": "send_recv", "recv": "send_recv"}


def _first_tensor(args):
    for a in args:
        if isinstance(a, torch.Tensor):
            return a
        if isinstance(a, (list, tuple)):
            t = _first_tensor(a)
            if t is not None:
                return t
    return None


def _op_name(opts) -> Optional[str]:
    op = getattr(opts, "reduceOp", None)
    if op is None:
        return None
    for name in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"):
        if op == getattr(dist.ReduceOp, name):
            return name.lower().replace("product", "product")
    return "premul_sum"


class TypedRefusals(GroupProxy):
    """What a well-behaved vendor plugin does (the hookspec): a combination its capability matrix
    does not declare raises `hal.NotSupportedError` before it reaches the CCL."""

    def __init__(self, inner: Any, caps: hal.CapabilityMatrix) -> None:
        super().__init__(inner)
        self.caps = caps

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.inner, name)
        coll = _METHOD_COLLECTIVE.get(name)
        if coll is None:
            return fn

        def guarded(*args):
            t = _first_tensor(args)
            opts = next((a for a in args if hasattr(a, "reduceOp")), None)
            op = _op_name(opts) if coll in ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor") else None
            if coll in ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor") and op is None:
                op = "sum"
            if t is not None:
                self.caps.check(coll, str(t.dtype).removeprefix("torch."), op)
            return fn(*args)
        return guarded


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
            kernels: Optional[Callable[[], list]] = None, typed_refusals: bool = True,
            native: Callable[[], bool] = lambda: True) -> None:
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
        return chip == spec.name and native()

    @hal.hookimpl
    def hal_chip_profile(chip, model):
        return profile() if profile else cpu_profile_for(spec.name)

    @hal.hookimpl
    def hal_device_runtime(chip):
        return runtime()

    def caps() -> hal.CapabilityMatrix:
        if capabilities is not None:
            return capabilities
        gloo = cpu_fabric_capabilities("gloo")
        return hal.CapabilityMatrix(chip=spec.name, entries=gloo.entries, source=f"gloo, wrapped: {gloo.source}")

    @hal.hookimpl
    def hal_create_process_group(chip, store, rank, world_size, timeout: timedelta):
        # gloo with the HAL's staging of strided views (torch 2.13's gloo ignores strides)
        pg = StridedSafeGloo(store, rank, world_size, timeout)
        pg = wrap_group(pg) if wrap_group else pg
        return TypedRefusals(pg, caps()) if typed_refusals else pg

    @hal.hookimpl
    def hal_collective_capabilities(chip):
        return caps()

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
