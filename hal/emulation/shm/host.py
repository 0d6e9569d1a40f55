"""Can these ranks share memory? Each rank publishes where it runs through the store; all compare.

Two processes can map the same POSIX shared-memory segment when they run on the same kernel (boot
id) and see the same /dev/shm (the tmpfs device number), and the fabric's dead-peer check needs
them to see each other's pids (same pid namespace). The hostname is carried only to name hosts in
messages: two containers may share a hostname and not a /dev/shm, or the reverse.
"""
from __future__ import annotations

import json
import os
import socket
from datetime import timedelta
from typing import Any


def host_identity() -> dict[str, Any]:
    """Where this process runs, as far as sharing memory is concerned."""
    def read(path: str) -> str:
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError:
            return ""

    def dev(path: str) -> int:
        try:
            return os.stat(path).st_dev
        except OSError:
            return -1

    def ino(path: str) -> int:
        try:
            return os.stat(path).st_ino
        except OSError:
            return -1

    return {"hostname": socket.gethostname(), "boot_id": read("/proc/sys/kernel/random/boot_id"),
            "shm_dev": dev("/dev/shm"), "pid_ns": ino("/proc/self/ns/pid"), "pid": os.getpid()}


def same_host_key(ident: dict[str, Any]) -> tuple:
    return ident["boot_id"], ident["shm_dev"], ident["pid_ns"]


def exchange_identities(store: Any, rank: int, world_size: int, timeout: timedelta,
                        prefix: str = "hal_shm_host", extra: dict | None = None) -> list[dict[str, Any]]:
    """Every rank's `host_identity()` (plus `extra`), in rank order (a collective over the store)."""
    store.set(f"{prefix}/{rank}", json.dumps({**host_identity(), **(extra or {})}))
    keys = [f"{prefix}/{r}" for r in range(world_size)]
    store.wait(keys, timeout)
    return [json.loads(store.get(k)) for k in keys]


def describe_hosts(idents: list[dict[str, Any]]) -> str:
    """'ranks [0, 1] on host a (boot 1234abcd); rank 2 on host b (...)' for error messages."""
    groups: dict[tuple, list[int]] = {}
    for r, ident in enumerate(idents):
        groups.setdefault(same_host_key(ident), []).append(r)
    parts = []
    for key, ranks in groups.items():
        ident = idents[ranks[0]]
        parts.append(f"ranks {ranks} on {ident['hostname']} (boot {str(ident['boot_id'])[:8]}, "
                     f"/dev/shm dev {ident['shm_dev']}, pid ns {ident['pid_ns']})")
    return "; ".join(parts)


def all_on_one_host(idents: list[dict[str, Any]]) -> bool:
    return len({same_host_key(i) for i in idents}) == 1
