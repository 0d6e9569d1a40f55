"""Session-wide fixtures: rank pools shared by test modules that need the same ranks.

A pool of N emulated ranks costs N `import torch` (about 3 s each on this 2-core host) plus joining the
`hetero` world; modules whose cases run on the same world (same size, same environment, every case
joining the default group with `hetero` if it is not joined yet) take their pool from `shared_pools`
instead of starting their own: one start-up for the session. A pool whose workers died (a case timed
out and killed it) is started again on the next request. Cases must not leave state a later module's
cases would trip on: they cache their subgroups per case module and never destroy the world group."""
from __future__ import annotations

from typing import Mapping

import pytest

from hal.testing import WorkerPool


class SharedPools:
    """Pools by (world size, environment), started on first use, closed at the end of the session."""

    def __init__(self) -> None:
        self._pools: dict[tuple, WorkerPool] = {}

    def get(self, world_size: int, env: Mapping[str, str]) -> WorkerPool:
        key = (world_size, tuple(sorted(env.items())))
        pool = self._pools.get(key)
        if pool is not None and not all(pool.alive()):
            pool.close(kill=True)
            pool = None
        if pool is None:
            pool = self._pools[key] = WorkerPool(world_size, env=dict(env))
        return pool

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()


@pytest.fixture(scope="session")
def shared_pools():
    pools = SharedPools()
    yield pools
    pools.close()
