"""Create and map the group's shared segment, then remove its name at once.

Rank 0 creates `/dev/shm/hal-shm-<pid>-<random>` and publishes the name (and the sizes every rank
must use) through the store; the others map it and report back; rank 0 then `shm_unlink`s the name,
so from the moment `create_comm` returns on any rank nothing is left in /dev/shm: the memory lives
only as long as some rank still maps it, and a crash (even SIGKILL) cannot leave a stale segment.
"""
from __future__ import annotations

import json
import os
import secrets
from datetime import timedelta
from typing import Any

from hal import envs
from hal.emulation.shm.errors import ShmSetupError

_PREFIX = "hal_shm_seg"


def _native():
    from hal.emulation.shm import _shm  # built by `pip install -e .` (setup.py); see hal/emulation/shm/__init__.py
    return _shm


def make_config(timeout: timedelta, slot_bytes: int | None = None, p2p_slot_bytes: int | None = None,
                spin_us: float | None = None):
    _shm = _native()
    cfg = _shm.Config()
    cfg.slot_bytes = int(slot_bytes or envs.HAL_SHM_SLOT_BYTES.get() or cfg.slot_bytes)
    cfg.p2p_slot_bytes = int(p2p_slot_bytes or envs.HAL_SHM_P2P_SLOT_BYTES.get() or cfg.p2p_slot_bytes)
    spin = spin_us if spin_us is not None else envs.HAL_SHM_SPIN_US.get()
    if spin is not None:
        cfg.spin_ns = int(float(spin) * 1000)
    cfg.timeout_ms = max(1, int(timeout.total_seconds() * 1000))
    return cfg


def create_comm(store: Any, rank: int, world_size: int, timeout: timedelta, config) -> Any:
    """The mapped communicator for this rank (a collective over `store`); rank 0's sizes win."""
    _shm = _native()
    if rank == 0:
        name = f"/hal-shm-{os.getpid()}-{secrets.token_hex(6)}"
        try:
            comm = _shm.Comm(name, True, 0, world_size, config)
        except Exception as exc:  # tell the others instead of letting them wait out the timeout
            store.set(f"{_PREFIX}/name", json.dumps({"error": f"rank 0: {type(exc).__name__}: {exc}"}))
            raise
        problems = []
        try:
            store.set(f"{_PREFIX}/name", json.dumps({
                "name": name, "slot_bytes": config.slot_bytes, "p2p_slot_bytes": config.p2p_slot_bytes,
                "p2p_slots": config.p2p_slots, "small_bytes": config.small_bytes}))
            keys = [f"{_PREFIX}/mapped/{r}" for r in range(1, world_size)]
            if keys:
                store.wait(keys, timeout)
            problems = [f"rank {r}: {v}" for r, v in
                        ((r, store.get(f"{_PREFIX}/mapped/{r}").decode()) for r in range(1, world_size))
                        if v != "ok"]
        except Exception as exc:
            problems = problems or [f"rank 0: waiting for the other ranks to map {name}: {exc}"]
        finally:
            _shm.unlink(name)
            store.set(f"{_PREFIX}/unlinked", "ok" if not problems else "; ".join(problems))
        if problems:
            comm.close()
            raise ShmSetupError(f"shm group of {world_size} ranks could not be set up: {'; '.join(problems)}",
                                rank=0, op="setup")
        return comm
    store.wait([f"{_PREFIX}/name"], timeout)
    info = json.loads(store.get(f"{_PREFIX}/name"))
    if "error" in info:
        raise ShmSetupError(f"shm group of {world_size} ranks could not be set up: {info['error']}",
                            rank=rank, op="setup")
    config.slot_bytes, config.p2p_slot_bytes = info["slot_bytes"], info["p2p_slot_bytes"]
    config.p2p_slots, config.small_bytes = info["p2p_slots"], info["small_bytes"]
    comm, status = None, "ok"
    try:
        comm = _shm.Comm(info["name"], False, rank, world_size, config)
    except Exception as exc:
        status = f"{type(exc).__name__}: {exc}"
    store.set(f"{_PREFIX}/mapped/{rank}", status)
    store.wait([f"{_PREFIX}/unlinked"], timeout)
    verdict = store.get(f"{_PREFIX}/unlinked").decode()
    if comm is None or verdict != "ok":
        if comm is not None:
            comm.close()
        raise ShmSetupError(f"shm group of {world_size} ranks could not be set up: "
                            f"{verdict if verdict != 'ok' else status}", rank=rank, op="setup")
    return comm
