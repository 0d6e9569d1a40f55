"""Stand-in for torch.distributed.ProcessGroupNCCL (absent from CPU builds of torch).

Follows torch 2.13 (pytorch/pytorch v2.13.0, git cf30153c, the copy installed here):
- `ProcessGroupNCCL.Options(is_high_priority_stream=False)` with the fields the pybind class has
  (torch/_C/_distributed_c10d.pyi: backend (read-only), _timeout, global_ranks_in_group,
  group_name, use_pg_for_symm_mem_rendezvous, config, is_high_priority_stream, split_from,
  split_color); any other attribute raises AttributeError as pybind does;
- `_new_process_group_helper` fills _timeout, global_ranks_in_group and group_name, constructs
  `ProcessGroupNCCL(store, group_rank, group_size, options)`, then `_set_sequence_number_for_group()`;
- ProcessGroupNCCL's constructor reads TORCH_NCCL_BLOCKING_WAIT and TORCH_NCCL_ASYNC_ERROR_HANDLING
  (default 3, SkipCleanUp) once (ProcessGroupNCCL.cpp). `WorkNCCL::wait(timeout)`: without a timeout
  and without blocking wait it only orders streams and returns at once; with one, it blocks the
  calling thread until the work completes or the timeout passes, then raises (DistBackendError,
  a RuntimeError). The watchdog, at `options._timeout`, aborts the communicators; with error
  handling 1 (TearDown) or 3 (SkipCleanUp) it then tears the process down (here: recorded in
  `TEARDOWNS` instead of aborting the test run), with 2 (CleanUpOnly) it does not.

Collectives: ranks of one group are fake PGs built on the same store object, driven from threads of
this process; each collective waits for every member's call (a member that never calls leaves the
work incomplete, which is how the tests make a collective time out).
"""
from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist

from ._fixed import FixedFields

CREATED: list[dict] = []     # one record per constructed group
TEARDOWNS: list[str] = []    # what the watchdog would have killed the process for
_GROUPS: dict[tuple, "_Rendezvous"] = {}
_LOCK = threading.Lock()
NO_TIMEOUT = timedelta(0)    # c10d's kNoTimeout


class _Rendezvous:
    """One group's table of posted calls: (seq) -> {rank: payload}."""

    def __init__(self, size: int):
        self.size = size
        self.cond = threading.Condition()
        self.posts: dict[int, dict[int, Any]] = {}


class FakeWork:
    def __init__(self, pg: "FakeProcessGroupNCCL", seq: int, finish):
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
        if not self.pg.blocking_wait and timeout == NO_TIMEOUT:
            return True  # stream ordering only: the host does not wait (real non-blocking NCCL)
        limit = (timeout if timeout != NO_TIMEOUT else self.pg.options._timeout).total_seconds()
        if not self._done.wait(limit):
            self.pg.abort()
            self._exc = dist.DistBackendError(
                f"[Rank {self.pg._rank}] Work WorkNCCL(SeqNum={self.seq}) ran for {int(limit * 1000)} "
                f"milliseconds before timing out (timed out in blocking wait)")
            raise self._exc
        return True


class FakeProcessGroupNCCL:
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
        self._rank, self._size, self.options, self.store = rank, size, options, store
        self.blocking_wait = os.environ.get("TORCH_NCCL_BLOCKING_WAIT", "0") == "1"
        self.async_error_handling = int(os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"))
        self.aborted = False
        self._seq = 0
        self.record = {"store": store, "rank": rank, "size": size, "timeout": options._timeout,
                       "is_high_priority_stream": options.is_high_priority_stream, "seq_set": False,
                       "global_ranks_in_group": list(options.global_ranks_in_group),
                       "group_name": options.group_name, "async_error_handling": self.async_error_handling,
                       "blocking_wait": self.blocking_wait, "class": type(self).__name__}
        CREATED.append(self.record)
        with _LOCK:
            self._rdv = _GROUPS.setdefault((id(store), options.group_name, size), _Rendezvous(size))

    # ---- identity -------------------------------------------------------------------------------
    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def getBackendName(self) -> str:
        return "nccl"

    def _set_sequence_number_for_group(self) -> None:
        self.record["seq_set"] = True

    def abort(self) -> None:
        self.aborted = True

    # ---- the collective engine -------------------------------------------------------------------
    def _post(self, payload: Any, finish) -> FakeWork:
        if self.aborted:
            raise dist.DistBackendError(f"[Rank {self._rank}] NCCL communicator was aborted")
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
        if work._done.wait(self.options._timeout.total_seconds()):
            return
        self.abort()
        if self.async_error_handling in (1, 3):
            TEARDOWNS.append(f"rank {self._rank} seq {work.seq}: watchdog timeout with "
                             f"TORCH_NCCL_ASYNC_ERROR_HANDLING={self.async_error_handling}: process torn down")

    @staticmethod
    def _reduce(tensors: list, op) -> torch.Tensor:
        stack = torch.stack([t.to(torch.float64) if t.is_floating_point() else t.to(torch.int64) for t in tensors])
        fn = {dist.ReduceOp.SUM: lambda s: s.sum(0), dist.ReduceOp.PRODUCT: lambda s: s.prod(0),
              dist.ReduceOp.MAX: lambda s: s.amax(0), dist.ReduceOp.MIN: lambda s: s.amin(0),
              dist.ReduceOp.AVG: lambda s: s.sum(0) / len(tensors)}
        if op not in fn:
            raise ValueError(f"Cannot use ReduceOp.{op} with NCCL")
        return fn[op](stack)

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


def reset() -> None:
    CREATED.clear()
    TEARDOWNS.clear()
    _GROUPS.clear()
