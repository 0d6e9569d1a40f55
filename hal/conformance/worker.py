"""The worker side: what each rank of the pool does to run one check.

A worker binds the chip named by a `WorkerSpec` (its own plugin manager, loaded with only the
plugins under test, so the pool can serve several plugins one after another), keeps one TCP store
for the pool's life, a gloo *control* group the suite trusts (to agree on outcomes), and the chip's
CCL group (`Accelerator.new_process_group`), which is what multi-process checks test. After a
check that failed on any rank the CCL group is rebuilt, so one broken collective cannot poison the
next check; the decision is agreed over the control group so every rank rebuilds in step. The
control group does not depend on the binding: a rank whose binding failed still agrees (as failed),
so a multi-rank check fails at once naming it instead of waiting for it.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Optional

from . import bounds
from .checks import run_check_fn
from .target import WorkerSpec

_STATE: Optional["WorkerContext"] = None
_STORE: Any = None
_STORE_KEY: Optional[tuple] = None
_GROUP_SEQ = 0
_CONTROL: Any = None
_CONTROL_STORE: Any = None


def _store():
    """One TCP store per pool (rank 0 serves it on MASTER_PORT), created on first use."""
    global _STORE, _STORE_KEY
    import torch.distributed as dist
    key = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["WORLD_SIZE"]))
    if _STORE is None or _STORE_KEY != key:
        rank = int(os.environ["RANK"])
        _STORE = dist.TCPStore(key[0], key[1], key[2], is_master=(rank == 0), timeout=timedelta(seconds=60),
                               wait_for_workers=False)
        _STORE_KEY = key
    return _STORE


def _next_prefix(kind: str) -> str:
    # Every rank creates groups in the same order (lockstep), so counters agree across ranks.
    global _GROUP_SEQ
    _GROUP_SEQ += 1
    return f"hal/conformance/{kind}/{_GROUP_SEQ}"


@dataclass
class WorkerContext:
    """What a worker-side check function receives."""

    spec: WorkerSpec
    acc: Any                        # hal.Accelerator bound for this spec
    rank: int
    world_size: int
    _ccl: dict = field(default_factory=dict, repr=False)
    _hetero: Any = field(default=None, repr=False)

    @property
    def device(self):
        return self.acc.device

    def new_group(self, timeout_s: Optional[float] = None) -> Any:
        """A fresh CCL group of the bound chip (its own store prefix), e.g. with a short timeout."""
        import torch.distributed as dist
        prefix = _next_prefix("ccl")
        timeout = timedelta(seconds=timeout_s if timeout_s is not None else self.spec.group_timeout_s)
        return self.acc.new_process_group(dist.PrefixStore(prefix, _store()), self.rank, self.world_size,
                                          timeout, global_ranks=list(range(self.world_size)), group_name=prefix)

    def ccl(self, world: Optional[int] = None) -> Any:
        """The chip's CCL group over ranks 0 .. `world` - 1 (default: every rank of the pool), built on
        first use and rebuilt after failures; None on ranks outside it. Every rank must call this at
        the same point (group creation is collective over the store), in or out of the group."""
        w = self.world_size if world is None else world
        if not 1 <= w <= self.world_size:
            raise ValueError(f"a group of {w} ranks in a pool of {self.world_size}")
        if w not in self._ccl:
            import torch.distributed as dist
            prefix = _next_prefix(f"ccl{w}")
            self._ccl[w] = None
            if self.rank < w:
                timeout = timedelta(seconds=self.spec.group_timeout_s)
                self._ccl[w] = self.acc.new_process_group(dist.PrefixStore(prefix, _store()), self.rank, w, timeout,
                                                          global_ranks=list(range(w)), group_name=prefix)
        return self._ccl[w]

    def hetero(self) -> Any:
        """A `hetero` group (ccl_bridge) over every rank, built straight through the backend's creator
        (no default group: the pool may serve several plugins one after another)."""
        if self._hetero is None:
            import torch.distributed as dist
            from torch._C._distributed_c10d import _DistributedBackendOptions

            import hal.ccl_bridge
            opts = _DistributedBackendOptions()
            opts.store = dist.PrefixStore(_next_prefix("hetero"), _store())
            opts.group_rank, opts.group_size = self.rank, self.world_size
            opts.timeout = timedelta(seconds=self.spec.group_timeout_s)
            opts.global_ranks_in_group = list(range(self.world_size))
            opts.group_id = f"conformance-{_GROUP_SEQ}"
            self._hetero = hal.ccl_bridge.create(opts)
        return self._hetero

    def drop_ccl(self) -> None:
        """Forget the groups built so far (the next check builds fresh ones)."""
        self._ccl = {}
        if self._hetero is not None:
            shutdown = getattr(self._hetero, "shutdown", None)
            if callable(shutdown):
                try:
                    shutdown()
                except Exception:  # a broken group may fail to shut down; it is dropped anyway
                    pass
            self._hetero = None

    def control(self) -> Any:
        """A gloo group on the host that the suite trusts, for agreement between ranks."""
        return _control(self.spec.group_timeout_s)

    def agree_max(self, values: list[float]) -> list[float]:
        """Element-wise max of `values` over ranks (on the control group)."""
        return _agree_max(values, self.spec.group_timeout_s)


def _control(group_timeout_s: float) -> Any:
    """The control group: one per pool, independent of the chip binding (a rank whose binding failed
    still agrees on outcomes with the others), under a fixed store prefix (so it does not depend on
    how many CCL groups each rank has created)."""
    global _CONTROL, _CONTROL_STORE
    store = _store()
    if _CONTROL is None or _CONTROL_STORE is not store:
        import torch.distributed as dist
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        _CONTROL = dist.ProcessGroupGloo(dist.PrefixStore("hal/conformance/control", store), rank, world,
                                         timedelta(seconds=group_timeout_s + 60))
        _CONTROL_STORE = store
    return _CONTROL


def _agree_max(values: list[float], group_timeout_s: float) -> list[float]:
    import torch
    import torch.distributed as dist
    t = torch.tensor(values, dtype=torch.float64)
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MAX
    _control(group_timeout_s).allreduce([t], opts).wait()
    return t.tolist()


def _bind(spec: WorkerSpec) -> WorkerContext:
    import hal
    from hal.core.plugin_manager import PluginManager, set_plugin_manager
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    hal.reset()
    pm = PluginManager()
    pm.load_entry_points(env={"HAL_PLUGINS": ",".join(spec.plugins)})
    set_plugin_manager(pm)
    chip = spec.chip_for(rank)
    acc = hal.bind(chip, emulated=spec.emulated and chip == spec.chip, pm=pm)
    if acc.device.type == "cpu":
        # Ranks share the host's cores: one torch thread pool per rank over all cores would
        # oversubscribe them (the spinning threads slow everything on a shared CI machine).
        import torch
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(world, 1)))
    return WorkerContext(spec=spec, acc=acc, rank=rank, world_size=world)


def context(spec: WorkerSpec) -> WorkerContext:
    """The bound context for `spec` (rebinding when the spec changed since the last check)."""
    global _STATE
    if _STATE is None or _STATE.spec != spec:
        old = _STATE
        _STATE = None
        if old is not None:
            old.drop_ccl()
        _STATE = _bind(spec)
    return _STATE


def ping() -> int:
    """The pool is up (spawned, torch importable)."""
    import torch  # noqa: F401  (the import is what takes the time)
    return os.getpid()


def prepare(spec: WorkerSpec, stack_path: Optional[str] = None, dump_after_s: float = 0.0) -> str:
    """Bind `spec` ahead of the first check (errors are left for that check to report). With
    `stack_path`, a binding still running after `dump_after_s` leaves its stacks there."""
    bounds.arm_stack_dump(stack_path and f"{stack_path}.rank{os.environ.get('RANK', 0)}", dump_after_s)
    try:
        return repr(context(spec).acc)
    except Exception as exc:
        return f"bind failed: {type(exc).__name__}: {exc}"
    finally:
        bounds.disarm_stack_dump()


def run_check(spec: WorkerSpec, where: str, fn: Callable, params: tuple, stack_path: Optional[str] = None,
              dump_after_s: float = 0.0) -> dict:
    """Run one check on this rank; returns {"status", "message", "data", "seconds"}.

    For multi-rank checks ("all") every rank reports whether it passed to the others; after any
    failure the CCL group is rebuilt on every rank (a failed collective can leave it unusable)."""
    bounds.arm_stack_dump(stack_path and f"{stack_path}.rank{os.environ.get('RANK', 0)}", dump_after_s)
    try:
        return _run_check(spec, where, fn, params)
    finally:
        bounds.disarm_stack_dump()


def _run_check(spec: WorkerSpec, where: str, fn: Callable, params: tuple) -> dict:
    t0 = time.perf_counter()
    try:
        ctx = context(spec)
    except Exception as exc:
        if where == "all" and int(os.environ.get("WORLD_SIZE", 1)) > 1:
            _agree_max([1.0], spec.group_timeout_s)  # the bound ranks wait for this rank's outcome
        return {"status": "failed", "message": f"could not bind chip {spec.chip_for(int(os.environ.get('RANK', 0)))!r}"
                f" (plugins {list(spec.plugins)}, emulated={spec.emulated}): {type(exc).__name__}: {exc}",
                "data": None, "seconds": time.perf_counter() - t0}
    status, message, data = run_check_fn(fn, ctx, params)
    if where == "all" and ctx.world_size > 1:
        worst = ctx.agree_max([1.0 if status == "failed" else 0.0])[0]
        if worst > 0:
            ctx.drop_ccl()
    return {"status": status, "message": message, "data": data, "seconds": time.perf_counter() - t0}
