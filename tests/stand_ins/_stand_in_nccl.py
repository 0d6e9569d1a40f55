"""Stand-in for torch.distributed.ProcessGroupNCCL (absent from CPU builds of torch), and the fake
collective engine the HCCL stand-in (torch_npu/_C/_distributed_c10d.py) shares.

Follows torch 2.13 (pytorch/pytorch v2.13.0, git cf30153c, the copy installed here; its
torch/include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp names every variable below, and
torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp as indexed from pytorch/pytorch main gives the
behaviour):
- `ProcessGroupNCCL.Options(is_high_priority_stream=False)` with the fields the pybind class has
  (torch/_C/_distributed_c10d.pyi: backend (read-only), _timeout, global_ranks_in_group,
  group_name, use_pg_for_symm_mem_rendezvous, config, is_high_priority_stream, split_from,
  split_color); any other attribute raises AttributeError as pybind does;
- `_new_process_group_helper` fills _timeout, global_ranks_in_group and group_name, constructs
  `ProcessGroupNCCL(store, group_rank, group_size, options)`, then `_set_sequence_number_for_group()`;
- the constructor reads TORCH_NCCL_BLOCKING_WAIT and TORCH_NCCL_ASYNC_ERROR_HANDLING (default 3,
  SkipCleanUp); its HeartbeatMonitor reads TORCH_NCCL_DUMP_ON_TIMEOUT (default true),
  TORCH_NCCL_ENABLE_MONITORING (default true), TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC (default 480),
  TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC (default 15000) and TORCH_NCCL_COORD_CHECK_MILSEC (default 1000).
  Each group gets a uid from a process-wide counter (`getUid()`; the first group is uid 0).
- `WorkNCCL::wait(timeout)`: without a timeout and without blocking wait it only orders streams and
  returns at once; with one, it blocks the calling thread until the work completes or the timeout
  passes, then aborts and raises (DistBackendError, a RuntimeError).
- `Watchdog::runLoop`, at `options._timeout`: `broadcastDumpSignal()` (unconditionally: the key
  `exception_dump` in the global store -- the group's store below every PrefixStore -- and the
  process-wide `shouldDump_`), sleeps 4 x the dump timeout, then with error handling 2 (CleanUpOnly)
  aborts the communicators, with 1 (TearDown) or 3 (SkipCleanUp) tears the process down.
- `HeartbeatMonitor::runLoop` of the uid-0 group with dump-on-timeout on polls `shouldDump_` and the
  store key; once either is set it dumps, sleeps TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC and then, unless
  that group was aborted or shut down meanwhile (`stop()`), terminates the process
  (`terminateProcess`, std::abort) when TORCH_NCCL_ENABLE_MONITORING is on. So a timeout on any rank
  kills every rank whose first NCCL group is still alive: a survivor that raised dies later.
A teardown is recorded in `TEARDOWNS` instead of aborting the test run. Everything here is one
process: the uid counter and `shouldDump_` are shared by the fake ranks a test drives from threads
(construct the group whose monitor you mean first).

Collectives: ranks of one group are fake PGs built on the same store object, driven from threads of
this process; each collective waits for every member's call (a member that never calls leaves the
work incomplete, which is how the tests make a collective time out).
"""
from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist

from ._fixed import FixedFields

CREATED: list[dict] = []     # one record per constructed group
TEARDOWNS: list[str] = []    # what the watchdog or the heartbeat monitor would have killed the process for
_GROUPS: dict[tuple, "_Rendezvous"] = {}
_LOCK = threading.Lock()
NO_TIMEOUT = timedelta(0)    # c10d's kNoTimeout
DUMP_KEY = "exception_dump"  # kStoreDumpKey
_PROCESS = {"next_uid": 0, "should_dump": False}  # ProcessGroupNCCL's static process_group_id, shouldDump_
_LIVE: list["FakeCollectiveGroup"] = []


def cvar(names: Sequence[str], default: str) -> str:
    """c10d's getCvarString: the first of `names` that is set wins (later ones are deprecated aliases)."""
    for name in names:
        value = os.environ.get(name)
        if value is not None:
            return value
    return default


def cvar_bool(names: Sequence[str], default: bool) -> bool:
    value = cvar(names, "")
    return default if value == "" else value.strip().lower() in ("1", "true", "y", "yes")


def global_store(store: Any) -> Any:
    """The store below every PrefixStore (`getUnderlyingNonPrefixStore`)."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store


class _Rendezvous:
    """One group's table of posted calls: (seq) -> {rank: payload}."""

    def __init__(self, size: int):
        self.size = size
        self.cond = threading.Condition()
        self.posts: dict[int, dict[int, Any]] = {}


class FakeWork:
    def __init__(self, pg: "FakeCollectiveGroup", seq: int, finish):
        self.pg, self.seq, self._finish = pg, seq, finish
        self._done = threading.Event()
        self._exc: Optional[BaseException] = None
        self.start = time.monotonic()

    def _complete(self) -> None:
        self._done.set()

    def is_completed(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: timedelta = NO_TIMEOUT) -> bool:
        if self._exc is not None:
            raise self._exc
        if not self.pg._host_waits(timeout):
            return True  # stream ordering only: the host does not wait
        limit = (timeout if timeout != NO_TIMEOUT else self.pg.options._timeout).total_seconds()
        if not self._done.wait(limit):
            self.pg.abort_comms()
            self._exc = self.pg._blocking_timeout_error(self, limit)
            raise self._exc
        return True


class FakeCollectiveGroup:
    """The collective engine of a fake vendor group (the subclass reads its variables and says how
    its works wait and what its watchdog does)."""

    def _start(self, store, rank: int, size: int, options, name: str) -> None:
        self._rank, self._size, self.options, self.store = rank, size, options, store
        self.aborted = False          # communicators aborted (no further collective)
        self.stopped = False          # abort() / shutdown(): the watchdog and the monitor are told to stop
        self._seq = 0
        with _LOCK:
            self._rdv = _GROUPS.setdefault((id(store), name, size), _Rendezvous(size))
            _LIVE.append(self)

    # ---- what a subclass decides -------------------------------------------------------------
    def _host_waits(self, timeout: timedelta) -> bool:
        raise NotImplementedError

    def _blocking_timeout_error(self, work: FakeWork, limit_s: float) -> BaseException:
        raise NotImplementedError

    def _on_watchdog_timeout(self, work: FakeWork) -> None:
        raise NotImplementedError

    def _teardown(self, why: str) -> None:
        TEARDOWNS.append(why)

    # ---- identity -------------------------------------------------------------------------------
    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def abort_comms(self) -> None:
        self.aborted = True

    def abort(self) -> None:
        """Backend::abort: the communicators, and the watchdog and heartbeat monitor threads stop."""
        self.aborted = self.stopped = True

    def shutdown(self) -> None:
        self.aborted = self.stopped = True

    # ---- the collective engine -------------------------------------------------------------------
    def _post(self, payload: Any, finish) -> FakeWork:
        if self.aborted:
            raise dist.DistBackendError(f"[Rank {self._rank}] {self.name().upper()} communicator "
                                        f"was aborted")
        seq = self._seq
        self._seq += 1
        work = FakeWork(self, seq, finish)
        rdv = self._rdv
        with rdv.cond:
            posts = rdv.posts.setdefault(seq, {})
            posts[self._rank] = (payload, work)
            if len(posts) == rdv.size:
                everyone = {r: p for r, (p, _) in posts.items()}
                for r, (_, w) in posts.items():
                    w._finish(everyone)
                    w._complete()
                del rdv.posts[seq]
        threading.Thread(target=self._watchdog, args=(work,), daemon=True).start()
        return work

    def _watchdog(self, work: FakeWork) -> None:
        if work._done.wait(self.options._timeout.total_seconds()) or self.stopped:
            return
        self._on_watchdog_timeout(work)

    def _reduce(self, tensors: list, op) -> torch.Tensor:
        stack = torch.stack([t.to(torch.float64) if t.is_floating_point() else t.to(torch.int64) for t in tensors])
        fn = {dist.ReduceOp.SUM: lambda s: s.sum(0), dist.ReduceOp.PRODUCT: lambda s: s.prod(0),
              dist.ReduceOp.MAX: lambda s: s.amax(0), dist.ReduceOp.MIN: lambda s: s.amin(0),
              dist.ReduceOp.AVG: lambda s: s.sum(0) / len(tensors)}
        if op not in fn:
            raise ValueError(f"Cannot use ReduceOp.{op} with {self.name().upper()}")
        return fn[op](stack)


    # ---- collectives ----------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        t = tensors[0]
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM

        def finish(everyone):
            t.copy_(self._reduce([everyone[r] for r in range(self._size)], op))
        return self._post(t.clone(), finish)

    def reduce(self, tensors, opts):
        t = tensors[0]

        def finish(everyone):
            if self._rank == opts.rootRank:
                t.copy_(self._reduce([everyone[r] for r in range(self._size)], opts.reduceOp))
        return self._post(t.clone(), finish)

    def broadcast(self, tensors, opts):
        t = tensors[0]

        def finish(everyone):
            t.copy_(everyone[opts.rootRank])
        return self._post(t.clone(), finish)

    def _allgather_base(self, out, inp, opts=None):
        def finish(everyone):
            out.view(-1).copy_(torch.cat([everyone[r].reshape(-1) for r in range(self._size)]))
        return self._post(inp.clone(), finish)

    def _reduce_scatter_base(self, out, inp, opts):
        n = out.numel()

        def finish(everyone):
            full = self._reduce([everyone[r].reshape(-1) for r in range(self._size)], opts.reduceOp)
            out.view(-1).copy_(full[self._rank * n:(self._rank + 1) * n])
        return self._post(inp.clone(), finish)

    def alltoall_base(self, out, inp, out_splits, in_splits, opts=None):
        def chunks(t, splits):
            splits = list(splits) or [t.numel() // self._size] * self._size
            return list(torch.split(t.reshape(-1), splits))

        def finish(everyone):
            out.view(-1).copy_(torch.cat([chunks(everyone[r][0], everyone[r][1])[self._rank]
                                          for r in range(self._size)]))
        return self._post((inp.clone(), list(in_splits)), finish)

    def barrier(self, opts=None):
        return self._post(None, lambda everyone: None)


class FakeProcessGroupNCCL(FakeCollectiveGroup):
    class Options(FixedFields):
        _FIELDS = ("_timeout", "global_ranks_in_group", "group_name", "use_pg_for_symm_mem_rendezvous",
                   "config", "is_high_priority_stream", "split_from", "split_color")
        _READ_ONLY = ("backend",)

        def __init__(self, is_high_priority_stream: bool = False) -> None:
            self._init(backend="nccl", _timeout=timedelta(minutes=10), global_ranks_in_group=[], group_name="",
                       use_pg_for_symm_mem_rendezvous=False, config=None,
                       is_high_priority_stream=is_high_priority_stream, split_from=None, split_color=0)

    def __init__(self, store, rank: int, size: int, options: "FakeProcessGroupNCCL.Options"):
        if not isinstance(options, FakeProcessGroupNCCL.Options):
            raise TypeError(f"__init__(): incompatible constructor arguments: options must be "
                            f"ProcessGroupNCCL.Options, got {type(options).__name__}")
        self.blocking_wait = cvar_bool(("TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT"), False)
        self.async_error_handling = int(cvar(("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"), "3"))
        self.dump_on_timeout = cvar_bool(("TORCH_NCCL_DUMP_ON_TIMEOUT",), True)
        self.monitoring = cvar_bool(("TORCH_NCCL_ENABLE_MONITORING",), True)
        self.heartbeat_timeout_s = float(cvar(("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",), "480"))
        self.dump_timeout_s = float(cvar(("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC",), "15000")) / 1000
        self.coord_check_s = float(cvar(("TORCH_NCCL_COORD_CHECK_MILSEC",), "1000")) / 1000
        with _LOCK:
            self.uid = _PROCESS["next_uid"]
            _PROCESS["next_uid"] += 1
        self._start(store, rank, size, options, options.group_name)
        self.record = {"store": store, "rank": rank, "size": size, "timeout": options._timeout,
                       "is_high_priority_stream": options.is_high_priority_stream, "seq_set": False,
                       "global_ranks_in_group": list(options.global_ranks_in_group),
                       "group_name": options.group_name, "async_error_handling": self.async_error_handling,
                       "blocking_wait": self.blocking_wait, "class": type(self).__name__, "uid": self.uid,
                       "dump_on_timeout": self.dump_on_timeout, "monitoring": self.monitoring}
        CREATED.append(self.record)
        if self.uid == 0 and self.dump_on_timeout:  # checkDumpSignal: only the first group's monitor polls
            threading.Thread(target=self._heartbeat_monitor, daemon=True).start()

    def name(self) -> str:  # c10d::Backend::getBackendName, bound to Python as `name` (no getBackendName there)
        return "nccl"

    def _set_sequence_number_for_group(self) -> None:
        self.record["seq_set"] = True

    # ---- WorkNCCL::wait and the watchdog -------------------------------------------------------
    def _host_waits(self, timeout: timedelta) -> bool:
        return self.blocking_wait or timeout != NO_TIMEOUT

    def _blocking_timeout_error(self, work: FakeWork, limit_s: float) -> BaseException:
        return dist.DistBackendError(
            f"[Rank {self._rank}] Work WorkNCCL(SeqNum={work.seq}) ran for {int(limit_s * 1000)} "
            f"milliseconds before timing out (timed out in blocking wait)")

    def _on_watchdog_timeout(self, work: FakeWork) -> None:
        # broadcastDumpSignal(): the global store's key for every rank's monitor, and this process's flag
        global_store(self.store).set(DUMP_KEY, str(self._rank))
        _PROCESS["should_dump"] = True
        time.sleep(4 * self.dump_timeout_s)  # "Give time for dumping before throwing exception"
        if self.async_error_handling in (1, 2):  # SHOULD_CLEAN_UP
            self.abort_comms()
        if self.async_error_handling in (1, 3):  # SHOULD_TEAR_DOWN
            self._teardown(f"rank {self._rank} seq {work.seq}: watchdog timeout with "
                           f"TORCH_NCCL_ASYNC_ERROR_HANDLING={self.async_error_handling}: process torn down")

    def _heartbeat_monitor(self) -> None:
        """HeartbeatMonitor::runLoop of the uid-0 group with dump-on-timeout on (see the docstring)."""
        store = global_store(self.store)
        while not self.stopped:
            time.sleep(self.coord_check_s)
            try:
                signalled = _PROCESS["should_dump"] or store.check([DUMP_KEY])
            except Exception:
                signalled = False
            if signalled:
                break
        if self.stopped:
            return
        time.sleep(self.heartbeat_timeout_s)  # "slept ... to verify there is indeed a watchdog hang"
        if not self.stopped and self.monitoring:
            self._teardown(f"rank {self._rank}: heartbeat monitor of the first NCCL group (uid 0) terminated "
                           f"the process after a dump signal (TORCH_NCCL_DUMP_ON_TIMEOUT=1, "
                           f"TORCH_NCCL_ENABLE_MONITORING=1)")


def reset() -> None:
    """Forget every group; stop the watchdogs and monitors of groups still alive (a new "process")."""
    with _LOCK:
        for pg in _LIVE:
            pg.stopped = True
        _LIVE.clear()
        _PROCESS.update(next_uid=0, should_dump=False)
    CREATED.clear()
    TEARDOWNS.clear()
    _GROUPS.clear()
