"""Emulated chips: a real chip's identity and profile on CPU tensors, with a CPU fabric for its CCL.

`HAL_EMULATE` maps global ranks (torchrun order) to chips: `cuda:2,ascend:2` makes ranks 0-1 cuda and
2-3 ascend; a bare name (`ascend`) makes every rank that chip.

Speed (by default an emulated chip computes at the host's speed):
- `HAL_EMULATE_TIMED=1`: timed emulation (hal.emulation.timed). Every aten op is charged to a virtual clock
  from its FLOPs and bytes at the chip's speed (`hal.emulation.timed.chip_speeds`: the catalog efficiency matrix, or
  a measured efficiency matrix; catalog memory bandwidth) divided by a time scale; the host sleeps
  up to the clock at synchronisation points (collectives, `.item()`, `synchronize()`), so the
  step takes the chip's time whatever the host's load. Communication stays real (CPU fabric).
  `HAL_EMULATE_TIME_SCALE=<float>` (default `hal.emulation.timed.DEFAULT_TIME_SCALE`): how many times slower
  than the real chip the emulated one runs; it must keep the host ahead (`clock.stats()` counts
  overruns). Each op is charged at the rate of the dtype it computes in (a chip without a figure
  for it: refused); `HAL_EMULATE_TIMED_DTYPE` re-maps dtypes explicitly (`float32=tf32`, `bfloat16`).
  `HAL_EMULATE_TIMED_MATRIX=<file or dir>`: measured efficiency matrices to charge at instead.
- `HAL_EMULATE_DILATION=1`: slows each emulated chip in wall time by the ratio of the
  fastest mapped chip's peak bf16 FLOP/s to its own, sleeping in proportion to the process's CPU
  time (see `runtime.EmulatedRuntime`); wrong under CPU contention. Exclusive with timed emulation.

`HAL_CPU_CCL` picks the CPU fabric: `auto` (the default) uses the shared-memory fabric (`hal.emulation.shm`)
when every rank of the group is on one host and gloo otherwise; `shm` or `gloo` forces one.
"""
from __future__ import annotations

import logging
import re
from datetime import timedelta
from typing import Mapping, Optional

import torch.distributed as dist

from hal import envs
from hal.contract.capabilities import CapabilityMatrix
from hal.contract.errors import ChipSelectionError
from hal.emulation.cpu_fabric import cpu_ccl, cpu_fabric_capabilities

__all__ = ["MAX_EMULATED_RANKS", "parse_emulate_map", "emulated_ranks", "emulated_chip_for_rank", "chips_in_map",
           "cpu_ccl", "cpu_fabric_capabilities", "emulated_capabilities", "create_cpu_process_group",
           "dilation_requested", "dilation_for"]

_log = logging.getLogger(__name__)
MAX_EMULATED_RANKS = 65536  # per item: far above any emulated job, far below a typo's 1e8
_ITEM = re.compile(r"^([a-z][a-z0-9_]*)(?::(\d+))?$")


def parse_emulate_map(text: str) -> list[tuple[str, Optional[int]]]:
    """`cuda:2,ascend:2` -> [("cuda", 2), ("ascend", 2)]; `ascend` -> [("ascend", None)]."""
    items = [t.strip() for t in text.split(",")]
    if not any(items):
        raise ChipSelectionError(f"HAL_EMULATE={text!r} names no chip; expected e.g. 'cuda:2,ascend:2' or 'ascend'")
    out = []
    for pos, item in enumerate(items, start=1):
        if not item:
            raise ChipSelectionError(f"HAL_EMULATE={text!r}: item {pos} is empty (a stray comma?); "
                                     f"expected e.g. 'cuda:2,ascend:2'")
        m = _ITEM.match(item)
        if not m:
            raise ChipSelectionError(f"HAL_EMULATE item {item!r} is not 'chip' or 'chip:count': "
                                     f"{_item_problem(item)} (in {text!r})")
        count = int(m.group(2)) if m.group(2) is not None else None
        if count == 0:
            raise ChipSelectionError(f"HAL_EMULATE item {item!r}: count must be >= 1 (in {text!r})")
        if count is not None and count > MAX_EMULATED_RANKS:
            raise ChipSelectionError(f"HAL_EMULATE item {item!r}: count {count} is above {MAX_EMULATED_RANKS} "
                                     f"(every rank is listed in memory; a typo?) (in {text!r})")
        out.append((m.group(1), count))
    if len(out) > 1 and any(c is None for _, c in out):
        raise ChipSelectionError(f"HAL_EMULATE={text!r}: with several chips every item needs a count, "
                                 f"e.g. 'cuda:2,ascend:2'")
    return out


def _item_problem(item: str) -> str:
    """Why `item` is not 'chip' or 'chip:count', as specifically as it can be said."""
    chip, _, count = item.partition(":")
    if chip != chip.lower() and _ITEM.match(item.lower()):
        return f"chip names are lower case, e.g. {item.lower()!r}"
    if count and not count.isdigit():
        return f"the count {count!r} is not a whole number >= 1"
    if not re.match(r"^[a-z][a-z0-9_]*$", chip):
        return f"the chip name {chip!r} is not lower-case letters, digits and '_' (e.g. 'cuda')"
    return "expected e.g. 'cuda' or 'cuda:2'"


def emulated_ranks(text: str, world_size: Optional[int] = None) -> Optional[list[str]]:
    """Chip of every global rank, or None for a single-name map (every rank, any world size)."""
    items = parse_emulate_map(text)
    if items[0][1] is None:
        return None
    ranks = [chip for chip, count in items for _ in range(count or 0)]
    if world_size is not None and len(ranks) != world_size:
        raise ChipSelectionError(f"HAL_EMULATE={text!r} maps {len(ranks)} ranks but WORLD_SIZE is {world_size}")
    return ranks


def emulated_chip_for_rank(text: str, rank: int, world_size: Optional[int] = None) -> str:
    items = parse_emulate_map(text)
    ranks = emulated_ranks(text, world_size)
    if ranks is None:
        return items[0][0]
    if not 0 <= rank < len(ranks):
        raise ChipSelectionError(f"HAL_EMULATE={text!r} maps ranks 0..{len(ranks) - 1}; rank {rank} is outside it")
    return ranks[rank]


def chips_in_map(text: str) -> list[str]:
    return [chip for chip, _ in parse_emulate_map(text)]


def emulated_capabilities(vendor: CapabilityMatrix) -> CapabilityMatrix:
    """An emulated chip can do natively what its vendor CCL declares *and* the CPU fabric does."""
    return vendor.intersect(cpu_fabric_capabilities(cpu_ccl()), chip=vendor.chip,
                            source=f"emulated: {vendor.source} ∩ CPU fabric {cpu_ccl()}")


def create_cpu_process_group(store: dist.Store, rank: int, world_size: int,
                             timeout: timedelta) -> dist.ProcessGroup:
    """The CPU fabric's group for `world_size` ranks, built straight from `store` (usable inside a
    backend creator, where no default group exists yet)."""
    backend = cpu_ccl()
    if backend == "auto":
        from hal.emulation.shm import choose_fabric  # hosts compared through the store: see hal.emulation.shm.host
        backend, why = choose_fabric(store, rank, world_size, timeout)
        _log.info("HAL_CPU_CCL=auto: %s for %d ranks (%s)", backend, world_size, why)
        if backend == "shm":
            from hal.emulation.shm import create_shm_process_group
            return create_shm_process_group(store, rank, world_size, timeout, check_host=False)
    elif backend == "shm":
        from hal.emulation.shm import create_shm_process_group  # the C++ shared-memory fabric
        return create_shm_process_group(store, rank, world_size, timeout)
    # gloo with non-contiguous tensors staged through contiguous copies: torch 2.13's gloo ignores
    # strides in broadcast/all_reduce/reduce/scatter (pytorch/pytorch#192920; see hal.emulation.gloo_group).
    from hal.emulation.gloo_group import StridedSafeGloo
    return StridedSafeGloo(store, rank, world_size, timeout)


def dilation_requested(env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether HAL_EMULATE_DILATION asks for speed dilation (a bad value raises ChipSelectionError)."""
    return envs.HAL_EMULATE_DILATION.get(env, error=ChipSelectionError)


def dilation_for(chip_peak: Optional[float], peers_peak: list[Optional[float]]) -> float:
    """Slow-down factor: fastest known peer peak / this chip's peak (1 if either is unknown)."""
    known = [p for p in peers_peak if p]
    if not chip_peak or not known:
        return 1.0
    return max(1.0, max(known) / chip_peak)
