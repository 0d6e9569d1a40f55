"""`hal.core.selection`: chip selection and the per-process accelerator (`hal.accelerator()`), bound once.

Chip selection, first match wins:
1. the explicit `chip=` argument, else `HAL_CHIP` (native; `HAL_CHIP=ascend HAL_EMULATE=ascend` to emulate);
2. `HAL_EMULATE` (emulated; `cuda:2,ascend:2` maps global ranks in torchrun order);
3. the cluster spec named by `HAL_CLUSTER` (a TOML file; `emulate = true` sub-clusters are emulated);
4. the one chip natively available (several: an error asking to choose); `cpu` never counts here. A
   chip whose tensors are host tensors (torch device type `cpu`, e.g. a plugin built on torch's CPU
   kernels) is natively available wherever its plugin is installed, so installing one makes it the
   default of every HAL program in that environment: selecting it this way warns once per process
   (`HostChipDefaultWarning`); HAL_CHIP=cpu or HAL_CHIP=<it> chooses explicitly and says nothing;
5. `cpu`.
After binding, every method below is a plain attribute copied from the runtime: no plugin lookup.
"""
from __future__ import annotations

import os
import sys
import uuid
import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from hal import envs
from hal.contract.capabilities import CapabilityMatrix
from hal.contract.chips import ChipProfile, ChipSpec
from hal.contract.errors import ChipSelectionError, ChipUnavailableError
from hal.contract.kernel import OP_NAMES, OpKernel
from hal.contract.runtime import DeviceRuntime
from hal.core.cluster import load_cluster_spec
from hal.core.plugin_manager import PluginManager, get_plugin_manager
from hal.core.topology import load_spec_for_world
from hal.emulation.emulate import (chips_in_map, create_cpu_process_group, dilation_for, dilation_requested,
                                   emulated_capabilities, emulated_chip_for_rank)
from hal.emulation.runtime import EmulatedRuntime


@dataclass(frozen=True)
class Selection:
    """Which chip this rank runs, whether emulated, and why (for `hal info` and errors)."""

    chip: str
    emulated: bool
    reason: str
    model: Optional[str] = None


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    try:
        return int(env.get(name, default))
    except ValueError:
        raise ChipSelectionError(f"{name}={env.get(name)!r} is not an integer") from None


def select_chip(pm: PluginManager, chip: Optional[str] = None, env: Optional[Mapping[str, str]] = None) -> Selection:
    """Decide this rank's chip by the order in the module docstring."""
    env = os.environ if env is None else env
    rank = _env_int(env, "RANK", 0)
    world = _env_int(env, "WORLD_SIZE", 0) or None
    emulate = envs.HAL_EMULATE.text(env)
    explicit = chip or envs.HAL_CHIP.text(env) or None
    if explicit:
        pm.chip(explicit)  # UnknownChipError names the known chips
        if emulate and explicit in chips_in_map(emulate):
            return Selection(explicit, True, f"HAL_CHIP/argument {explicit!r}, emulated per HAL_EMULATE")
        return Selection(explicit, False, f"explicit chip {explicit!r}")
    if emulate:
        name = emulated_chip_for_rank(emulate, rank, world)
        pm.chip(name)
        return Selection(name, True, f"HAL_EMULATE={emulate!r}, rank {rank}")
    cluster_path = envs.HAL_CLUSTER.text(env)
    if cluster_path:
        a = load_spec_for_world(cluster_path, world, ChipSelectionError, "WORLD_SIZE").assignment(rank)
        pm.chip(a.chip)
        return Selection(a.chip, a.emulated, f"cluster spec {cluster_path}, rank {rank} in sub-cluster "
                         f"{a.sub_cluster!r}", model=a.model)
    native = [name for name in pm.chips if name != "cpu" and pm.native_available(name)]
    if len(native) > 1:
        raise ChipSelectionError(f"several chips are natively available ({native}); choose one with "
                                 f"HAL_CHIP or the cluster spec")
    if native:
        if pm.chips[native[0]][0].torch_device_type == "cpu":
            _warn_host_default(native[0], pm.chips[native[0]][1])
            return Selection(native[0], False, "the one chip natively available (host tensors: it is the "
                             "default wherever its plugin is installed; HAL_CHIP=cpu for the cpu chip)")
        return Selection(native[0], False, "the one chip natively available")
    return Selection("cpu", False, "no accelerator found; the host CPU")


class HostChipDefaultWarning(UserWarning):
    """A chip computing on host tensors became this process's default only because its plugin is installed."""


_WARNED_HOST_DEFAULT: set[str] = set()


def _warn_host_default(chip: str, plugin: str) -> None:
    if chip in _WARNED_HOST_DEFAULT:
        return
    _WARNED_HOST_DEFAULT.add(chip)
    warnings.warn(f"chip {chip!r} (plugin {plugin!r}) is this process's default chip: it is the one chip "
                  f"natively available besides cpu, and its tensors are host (CPU) tensors, so it is available "
                  f"wherever its plugin is installed. Set HAL_CHIP=cpu for the reference cpu chip, or "
                  f"HAL_CHIP={chip} to choose it explicitly (no warning).", HostChipDefaultWarning, stacklevel=3)


class Accelerator:
    """The bound chip of this process. Attributes mirror torch.accelerator / torch.cuda names."""

    def __init__(self, pm: PluginManager, selection: Selection, env: Optional[Mapping[str, str]] = None):
        env = os.environ if env is None else env
        self.selection = selection
        self.chip: ChipSpec = pm.chip(selection.chip)
        self.plugin: str = pm.plugin_of(selection.chip).name
        self.emulated: bool = selection.emulated
        self._pm = pm
        if self.emulated:
            self.profile: ChipProfile = pm.profile(selection.chip, selection.model)
            clock = _timed_clock(self.chip.name, self.profile, env)
            runtime: DeviceRuntime = EmulatedRuntime(self.chip.name, 1.0 if clock else self._dilation(pm, env),
                                                     clock=clock)
            if clock is not None:
                from hal.emulation import timed
                timed.install(clock)  # charge this thread's ops to the emulated chip from now on
            self.capabilities: CapabilityMatrix = emulated_capabilities(pm.capabilities(selection.chip))
        else:
            if not pm.native_available(selection.chip):
                raise ChipUnavailableError(
                    f"chip {selection.chip!r} (plugin {self.plugin!r}) is not natively available in this "
                    f"process ({selection.reason}); to run it emulated set HAL_EMULATE={selection.chip}")
            runtime = pm.call_owner(selection.chip, "hal_device_runtime")
            if not isinstance(runtime, DeviceRuntime):
                raise ChipUnavailableError(f"plugin {self.plugin!r}, hook 'hal_device_runtime': returned "
                                           f"{runtime!r}, expected hal.DeviceRuntime")
            # Select this rank's device before anything asks the runtime about "the current device"
            # (its name, the SoC the capability matrix depends on): on torch_npu and CUDA such a
            # query first opens a context on device 0, in every rank of the node (torch_npu
            # npu/utils.py `current_device` calls `_lazy_init()`, Ascend/pytorch@9e73e708).
            count = runtime.device_count()
            if count < 1:
                raise ChipUnavailableError(f"chip {self.chip.name!r}: the runtime reports 0 devices")
            runtime.set_device_index(_env_int(env, "LOCAL_RANK", 0) % count)
            model = selection.model or _device_name(runtime)
            self.profile = pm.profile(selection.chip, model)
            self.capabilities = pm.capabilities(selection.chip)
        self.runtime = runtime
        # Bind the runtime surface once (torch.accelerator naming).
        self.device_type: str = runtime.device_type
        self.device_count = runtime.device_count
        self.current_device_index = runtime.current_device_index
        self.set_device_index = runtime.set_device_index
        self.synchronize = runtime.synchronize
        self.Stream = runtime.Stream
        self.Event = runtime.Event
        self.current_stream = runtime.current_stream
        self.memory_allocated = runtime.memory_allocated
        self.max_memory_allocated = runtime.max_memory_allocated
        self.memory_reserved = runtime.memory_reserved
        self.reset_peak_memory_stats = runtime.reset_peak_memory_stats
        self.memory_stats = runtime.memory_stats
        self.get_memory_info = runtime.get_memory_info
        self.pin_memory = runtime.pin_memory
        self.supported_dtypes = runtime.supported_dtypes
        self.device: torch.device = runtime.device()
        self.kernels: dict[str, OpKernel] = self._select_kernels(pm)

    def _dilation(self, pm: PluginManager, env: Mapping[str, str]) -> float:
        if not dilation_requested(env):
            return 1.0
        # Peers: the chips this job mixes, from HAL_EMULATE or else the cluster spec (with models).
        emulate = envs.HAL_EMULATE.text(env)
        cluster_path = envs.HAL_CLUSTER.text(env)
        if emulate:
            peers = [pm.profile(c).peak("bfloat16") for c in chips_in_map(emulate)]
        elif cluster_path:
            spec = load_cluster_spec(cluster_path)
            peers = [pm.profile(s.chip, s.model).peak("bfloat16") for s in spec.sub_clusters]
        else:
            peers = [self.profile.peak("bfloat16")]
        return dilation_for(self.profile.peak("bfloat16"), peers)

    def _select_kernels(self, pm: PluginManager) -> dict[str, OpKernel]:
        from hal.ops.reference import KERNELS as REFERENCE_KERNELS  # a leaf module: kernels only
        table = {op: OpKernel(op, REFERENCE_KERNELS[op], priority=0, name=f"reference.{op}",
                              plugin="hal") for op in OP_NAMES}
        for k in reversed(pm.op_kernels(self.chip.name, self.emulated)):  # ascending priority
            if k.priority >= table[k.op].priority:
                table[k.op] = k
        return table

    # ---- calls that are not plain runtime attributes ----------------------------------------
    def manual_seed(self, seed: int) -> None:
        """Seed the host generator and this chip's generator."""
        torch.manual_seed(seed)
        self.runtime.manual_seed(seed)

    def new_process_group(self, store: Any, rank: int, world_size: int, timeout: timedelta, *,
                          global_ranks: Optional[Sequence[int]] = None, group_name: Optional[str] = None) -> Any:
        """This chip's CCL group for `world_size` ranks: the plugin's (native) or the CPU fabric.

        `global_ranks` (the members' global ranks, in group-rank order) and `group_name` (the same on
        every member, unique in the job) are handed to the plugin (contract 1.1). Callers that
        know them (the bridge: torch's `global_ranks_in_group` and group id) should pass them; when
        omitted they are agreed through `store` (`agree_group_identity`: one store round per member),
        never taken from a per-process counter."""
        if self.emulated:
            return create_cpu_process_group(store, rank, world_size, timeout)
        agreed_name, agreed_ranks = "", list(range(world_size))
        valid = isinstance(timeout, timedelta) and timeout.total_seconds() > 0 and 0 <= rank < world_size
        if (global_ranks is None or group_name is None) and valid:  # else the plugin refuses the arguments
            agreed_name, agreed_ranks = agree_group_identity(store, rank, world_size, timeout)
        ranks = agreed_ranks if global_ranks is None else [int(r) for r in global_ranks]
        if len(ranks) != world_size or len(set(ranks)) != world_size or min(ranks, default=0) < 0:
            raise ValueError(f"chip {self.chip.name!r}, new_process_group: global_ranks={ranks} must be "
                             f"{world_size} distinct non-negative ranks (world_size={world_size})")
        name = agreed_name if group_name is None else str(group_name)
        if not name:
            raise ValueError(f"chip {self.chip.name!r}, new_process_group: group_name must be a non-empty "
                             f"string that every member shares, got {group_name!r}")
        return self._pm.call_owner(self.chip.name, "hal_create_process_group", store=store, rank=rank,
                                   world_size=world_size, timeout=timeout, global_ranks=ranks,
                                   group_name=name)

    def describe(self) -> dict:
        return {"chip": self.chip.name, "plugin": self.plugin, "emulated": self.emulated,
                "torch_device_type": self.chip.torch_device_type, "ccl_backend": self.chip.ccl_backend,
                "device": str(self.device), "profile_model": self.profile.model,
                "selected_by": self.selection.reason,
                "kernels": {op: k.describe() for op, k in self.kernels.items() if k.priority > 0}}

    def __repr__(self) -> str:
        tag = "emulated" if self.emulated else "native"
        return f"Accelerator(chip={self.chip.name!r}, {tag}, device={self.device})"


GROUP_NAME_KEY = "hal/group_name"


def agree_group_identity(store: Any, rank: int, world_size: int, timeout: timedelta) -> tuple[str, list[int]]:
    """(name, global ranks) of a new group, the same on every member, when the caller did not give
    them: rank 0 writes a random name and every member its global rank (torchrun's RANK; its group
    rank without one) under keys numbered by how many groups this member has built on `store`
    (every member builds the same groups on one store prefix in the same order, as torch assumes);
    each waits for all of them, at most `timeout` (a torch.distributed error after it, never a hang)."""
    gen = store.add(f"{GROUP_NAME_KEY}/gen/{rank}", 1)
    base = f"{GROUP_NAME_KEY}/{gen}"
    if rank == 0:
        store.set(f"{base}/name", f"hal-{uuid.uuid4().hex[:16]}")
    store.set(f"{base}/rank/{rank}", os.environ.get("RANK", str(rank)))
    keys = [f"{base}/name"] + [f"{base}/rank/{r}" for r in range(world_size)]
    store.wait(keys, timeout)
    return store.get(keys[0]).decode(), [int(store.get(k)) for k in keys[1:]]


def _timed_clock(chip: str, profile: ChipProfile, env: Mapping[str, str]):
    """The timed-emulation clock HAL_EMULATE_TIMED asks for (hal.emulation.timed), or None; with
    HAL_EMULATE_DILATION also on, a TimedEmulationError (the two slow a chip down two different ways)."""
    from hal.emulation import timed
    if not timed.timed_requested(env):
        return None
    if dilation_requested(env):
        raise timed.TimedEmulationError(
            f"HAL_EMULATE_TIMED={envs.HAL_EMULATE_TIMED.text(env)!r} and HAL_EMULATE_DILATION="
            f"{envs.HAL_EMULATE_DILATION.text(env)!r} are exclusive: timed emulation replaces dilation (unset one)")
    return timed.clock_from_env(chip, profile, env)


def _device_name(runtime: DeviceRuntime) -> Optional[str]:
    fn = getattr(runtime, "device_name", None)
    return fn() if callable(fn) else None


_BOUND: Optional[Accelerator] = None
# Called with the new kernel table at every binding and with None at reset(). hal.ops registers here:
# it sits above this module (its forwarders bind the accelerator on first use).
_BIND_LISTENERS: list[Callable[[Optional[Mapping[str, OpKernel]]], None]] = []


def on_bind(listener: Callable[[Optional[Mapping[str, OpKernel]]], None]) -> None:
    """Call `listener(kernels)` whenever this process binds an accelerator, and `listener(None)` at reset()."""
    _BIND_LISTENERS.append(listener)


def _notify(kernels: Optional[Mapping[str, OpKernel]]) -> None:
    for listener in list(_BIND_LISTENERS):
        listener(kernels)


def accelerator(chip: Optional[str] = None) -> Accelerator:
    """The accelerator of this process, bound on first call. A later call naming another chip raises:
    one chip kind per process (PyTorch allows one PrivateUse1 backend per process)."""
    global _BOUND
    if _BOUND is not None:
        if chip is not None and chip != _BOUND.chip.name:
            raise ChipSelectionError(f"this process is bound to chip {_BOUND.chip.name!r}; cannot rebind to "
                                     f"{chip!r} (call hal.reset() first in tests)")
        return _BOUND
    pm = get_plugin_manager()
    acc = Accelerator(pm, select_chip(pm, chip))
    _notify(acc.kernels)
    _BOUND = acc
    return acc


def bind(chip: str, emulated: bool = False, model: Optional[str] = None,
         pm: Optional[PluginManager] = None) -> Accelerator:
    """Bind this process to `chip` explicitly (tests, notebooks), replacing any earlier binding."""
    global _BOUND
    pm = pm or get_plugin_manager()
    acc = Accelerator(pm, Selection(chip, emulated, "hal.bind()", model))
    _notify(acc.kernels)
    _BOUND = acc
    return acc


def bound() -> Optional[Accelerator]:
    """The bound accelerator, or None before the first `accelerator()` call."""
    return _BOUND


def reset() -> None:
    """Forget the binding and the kernel table (the plugin manager stays)."""
    global _BOUND
    _BOUND = None
    _notify(None)
    if "hal.emulation.timed" in sys.modules:  # stop charging a timed-emulation clock (tests rebind)
        sys.modules["hal.emulation.timed"].uninstall()
