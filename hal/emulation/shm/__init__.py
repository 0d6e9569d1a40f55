"""hal.emulation.shm: shared-memory intra-node collectives (C++ via pybind11) as a torch.distributed backend.

    import hal.emulation.shm                                  # registers the backend name "shm"
    dist.init_process_group("shm")                  # or dist.new_group(ranks, backend="shm")
    pg = hal.emulation.shm.create_shm_process_group(store, rank, world_size, timeout)   # inside a creator

All ranks of a group must be on one host (same kernel, same /dev/shm, same pid namespace; see
`hal.emulation.shm.host`); `hal.emulation.emulate.create_cpu_process_group` picks shm or gloo by that rule. The
segment's name is removed from /dev/shm as soon as every rank has mapped it. Every wait is bounded
by the group's timeout and a dead peer is noticed within about 50 ms (its pid is checked while
waiting); errors are the typed `hal.emulation.shm.errors` classes. Tuning (environment, read at creation):
HAL_SHM_SLOT_BYTES (chunk per rank, default 1 MiB), HAL_SHM_P2P_SLOT_BYTES (default 256 KiB),
HAL_SHM_SPIN_US (bounded spin before sleeping, default 20).
"""
from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, Optional

import torch.distributed as dist

from hal.emulation.shm.errors import (ShmAbortedError, ShmError, ShmMismatchError, ShmPeerDiedError, ShmSetupError,
                     ShmTimeoutError, ShmUnsupportedError)
from hal.emulation.shm.host import all_on_one_host, describe_hosts, exchange_identities

if TYPE_CHECKING:
    from hal.emulation.shm.process_group import ShmProcessGroup

BACKEND_NAME = "shm"

__all__ = ["BACKEND_NAME", "available", "choose_fabric", "create_shm_process_group", "ShmProcessGroup", "ShmError",
           "ShmTimeoutError", "ShmPeerDiedError", "ShmMismatchError", "ShmAbortedError", "ShmSetupError",
           "ShmUnsupportedError"]


def available() -> tuple[bool, str]:
    """(True, "") if the C++ extension imports; else (False, why) - e.g. a build without a compiler."""
    try:
        from hal.emulation.shm import _shm  # noqa: F401
    except ImportError as exc:
        return False, (f"hal.emulation.shm._shm did not import ({exc}): this install has no shared-memory "
                       f"fabric (built with HAL_BUILD_SHM=0, or without a compiler); to get it, reinstall with a C++17 "
                       f"compiler and HAL_BUILD_SHM unset (`pip install .`), or install the project's wheel; "
                       f"meanwhile HAL_CPU_CCL=auto (the default) uses gloo")
    return True, ""


def create_shm_process_group(store: Any, rank: int, world_size: int, timeout: timedelta, *,
                             slot_bytes: Optional[int] = None, p2p_slot_bytes: Optional[int] = None,
                             spin_us: Optional[float] = None, check_host: bool = True) -> "ShmProcessGroup":
    """The shm group for `world_size` ranks, built straight from `store` (a collective: every rank
    calls it). Raises `ShmSetupError` if the ranks are not all on one host."""
    from hal.emulation.shm.process_group import ShmProcessGroup
    from hal.emulation.shm.segment import create_comm, make_config

    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    ok, why = available()
    if not ok:
        raise ShmSetupError(why, rank=rank, op="setup")
    if check_host and world_size > 1:
        idents = exchange_identities(store, rank, world_size, timeout)
        if not all_on_one_host(idents):
            raise ShmSetupError(f"shm needs every rank on one host, but {describe_hosts(idents)}; "
                                f"use gloo (HAL_CPU_CCL=gloo or auto)", rank=rank, op="setup")
    config = make_config(timeout, slot_bytes, p2p_slot_bytes, spin_us)
    comm = create_comm(store, rank, world_size, timeout, config)
    return ShmProcessGroup(comm, store, rank, world_size, timeout, config.slot_bytes)


def choose_fabric(store: Any, rank: int, world_size: int, timeout: timedelta) -> tuple[str, str]:
    """("shm" | "gloo", why): shm when every rank of the group is on one host (same kernel boot id,
    same /dev/shm, same pid namespace: see `hal.emulation.shm.host`) and has the extension; gloo otherwise.
    A collective over `store`: every rank gets the same answer."""
    ok, why = available()
    idents = exchange_identities(store, rank, world_size, timeout, extra={"shm_ok": ok, "shm_why": why})
    missing = [r for r, i in enumerate(idents) if not i.get("shm_ok")]
    if missing:
        return "gloo", f"ranks {missing} cannot load the shm extension ({idents[missing[0]].get('shm_why')})"
    if not all_on_one_host(idents):
        return "gloo", f"the ranks span several hosts: {describe_hosts(idents)}"
    return "shm", f"all {world_size} ranks on one host ({idents[0]['hostname']})"


def _creator(store: Any, rank: int, world_size: int, timeout: timedelta) -> "ShmProcessGroup":
    return create_shm_process_group(store, rank, world_size, timeout)


def _register() -> None:
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, _creator, devices=["cpu"])


_register()


def __getattr__(name: str) -> Any:  # ShmProcessGroup without importing torch internals eagerly
    if name == "ShmProcessGroup":
        from hal.emulation.shm.process_group import ShmProcessGroup
        return ShmProcessGroup
    raise AttributeError(name)
