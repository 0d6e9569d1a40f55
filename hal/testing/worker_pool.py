"""A pool of N long-lived rank processes, so a test module pays process start-up (about 3 s per
`import torch`) once and then runs many cases on the same ranks.

    with WorkerPool(4, env={"HAL_EMULATE": "cuda:2,ascend:2"}) as pool:
        results = pool.run(my_module.case, 1024, timeout=60)   # case(*args) on every rank

Each worker gets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) plus `env` (a dict for every rank, or a list with one dict per rank), set before the
function's module is imported. As torchrun does for more than one process per node, OMP_NUM_THREADS
defaults to 1 (an `env` entry overrides it): N ranks with a thread per core each oversubscribe the
host's cores, and an intra-op parallel region then waits for a descheduled sibling thread (measured on
this 2-core host under load: a 128x32 by 32x64 linear 0.09 ms with one thread, 10.5 ms with two).
Functions must be importable (module-level). A worker that raises
reports its traceback; a worker that dies is reported as dead; a run that outlives `timeout` kills
the pool (no hang) and raises.
"""
from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import socket
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Mapping, Optional, Sequence, Union


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Outcome:
    """What one rank's call ended with."""

    rank: int
    ok: bool
    value: Any = None
    error: Optional[str] = None  # "TypeName: message" of the exception
    error_type: Optional[str] = None
    traceback: Optional[str] = None
    died: bool = False
    seconds: float = 0.0


class WorkerError(RuntimeError):
    """Some rank failed; the message carries every failing rank's error and traceback."""

    def __init__(self, outcomes: Sequence[Outcome]):
        self.outcomes = list(outcomes)
        bad = [o for o in outcomes if not o.ok]
        parts = [f"rank {o.rank}: {'died' if o.died else o.error}\n{o.traceback or ''}" for o in bad]
        super().__init__(f"{len(bad)} of {len(outcomes)} ranks failed:\n" + "\n".join(parts))


def _worker_main(rank: int, env: dict, conn: Connection) -> None:
    os.environ.update(env)
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        module_name, qualname, args, kwargs = msg
        t0 = time.perf_counter()
        try:
            obj: Any = importlib.import_module(module_name)
            for part in qualname.split("."):
                obj = getattr(obj, part)
            value = obj(*args, **kwargs)
            reply = Outcome(rank, True, value=value, seconds=time.perf_counter() - t0)
        except BaseException as exc:  # report everything, keep serving
            reply = Outcome(rank, False, error=f"{type(exc).__name__}: {exc}", error_type=type(exc).__name__,
                            traceback=traceback.format_exc(), seconds=time.perf_counter() - t0)
        try:
            conn.send(reply)
        except Exception as exc:  # result not picklable
            conn.send(Outcome(rank, False, error=f"result not picklable: {exc}", error_type="PicklingError"))


class WorkerPool:
    def __init__(self, world_size: int, env: Union[dict, Sequence[dict], None] = None,
                 local_world_size: Optional[int] = None):
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if isinstance(env, (list, tuple)) and len(env) != world_size:
            raise ValueError(f"env has {len(env)} entries for {world_size} ranks")
        self.world_size = world_size
        self.port = free_port()
        lws = local_world_size or world_size
        ctx = mp.get_context("spawn")
        self._conns: list[Connection] = []
        self._procs: list[Any] = []  # spawn-context processes
        for rank in range(world_size):
            base = {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank % lws),
                    "LOCAL_WORLD_SIZE": str(lws), "GROUP_RANK": str(rank // lws),
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(self.port)}
            if lws > 1:
                base["OMP_NUM_THREADS"] = "1"
            extra: dict = dict(env or {}) if env is None or isinstance(env, Mapping) else env[rank]
            base.update({k: str(v) for k, v in extra.items()})
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, args=(rank, base, child), daemon=True,
                               name=f"hal-worker-{rank}")
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)

    def run(self, fn: Callable, *args: Any, timeout: float = 120.0, check: bool = True,
            ranks: Optional[Sequence[int]] = None, **kwargs: Any) -> list:
        """Call `fn(*args, **kwargs)` on every rank (or `ranks`); return the values in rank order.

        With `check=False`, return the `Outcome` of every rank instead of raising on failure.
        A timeout kills every worker (the pool is unusable afterwards) and raises TimeoutError.
        """
        msg = (fn.__module__, fn.__qualname__, args, kwargs)
        ranks = list(range(self.world_size)) if ranks is None else list(ranks)
        for r in ranks:
            self._conns[r].send(msg)
        outcomes: dict[int, Outcome] = {}
        deadline = time.monotonic() + timeout
        pending: dict[Any, int] = {self._conns[r]: r for r in ranks}
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close(kill=True)
                raise TimeoutError(f"{fn.__qualname__} did not finish within {timeout}s on ranks "
                                   f"{sorted(pending.values())}; pool killed")
            for ready in wait(list(pending), timeout=min(left, 1.0)):
                conn: Any = ready
                r = pending.pop(conn)
                try:
                    outcomes[r] = conn.recv()
                except (EOFError, OSError):
                    outcomes[r] = Outcome(r, False, error="worker process died", died=True)
            for conn, r in list(pending.items()):
                if not self._procs[r].is_alive() and not conn.poll():
                    pending.pop(conn)
                    outcomes[r] = Outcome(r, False, error=f"worker process died (exit code "
                                          f"{self._procs[r].exitcode})", died=True)
        ordered = [outcomes[r] for r in ranks]
        if not check:
            return ordered
        if not all(o.ok for o in ordered):
            raise WorkerError(ordered)
        return [o.value for o in ordered]

    def alive(self) -> list[bool]:
        return [p.is_alive() for p in self._procs]

    def close(self, kill: bool = False) -> None:
        for conn, proc in zip(self._conns, self._procs):
            if not kill and proc.is_alive():
                try:
                    conn.send(None)
                except (OSError, BrokenPipeError):
                    pass
        for proc in self._procs:
            proc.join(0 if kill else 10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        for conn in self._conns:
            conn.close()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
