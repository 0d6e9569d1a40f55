"""Async execution of a `hetero` group's collectives, and the work objects torch waits on.

Each group owns one executor thread. A collective call enqueues a job and returns a `BridgeWork`
at once (async_op=True gives it to the user; DDP chains on its future). Jobs run in call order,
which is the order every rank calls them, so each inner group sees the same op sequence on all
its members. The job runs the algorithm (blocking on inner works, which themselves time out after
the group's timeout), then completes the work's future.

`BridgeWork.wait()` never hangs: it waits at most until the job's deadline (start + timeout +
grace) and raises `BridgeTimeoutError` naming op and sequence number; an inner failure is re-raised
as `BridgeTimeoutError` (the inner group timed out) or `BridgePeerError` (a peer died or raised).
After a failure the group is *broken*: like NCCL after a timeout, later collectives on it raise
`BridgePeerError` at once (the ranks may no longer agree on where they are), and the inner groups
are aborted so peers blocked on this rank fail fast instead of waiting out their timeout.
"""
from __future__ import annotations

import queue
import threading
import time
from datetime import timedelta
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from .ccl import Handle, StageFailure
from .errors import BridgeCollectiveError, BridgePeerError, BridgeTimeoutError

_TIMEOUT_WORDS = ("timed out", "timeout", "deadline")


def classify(exc: BaseException, *, op: str, seq: int, group: str, elapsed: float) -> BridgeCollectiveError:
    """Turn an inner failure into a typed bridge error naming op, seq, group and stage."""
    if isinstance(exc, BridgeCollectiveError):
        return exc
    stage = exc.stage if isinstance(exc, StageFailure) else ""
    cause = exc.cause if isinstance(exc, StageFailure) else exc
    text = str(cause)
    where = f"group {group!r}, op {op} (collective #{seq})" + (f", stage: {stage}" if stage else "")
    if any(w in text.lower() for w in _TIMEOUT_WORDS):
        return BridgeTimeoutError(f"{where}: timed out after {elapsed:.1f}s: {type(cause).__name__}: {text}",
                                  op=op, seq=seq, stage=stage, group=group)
    return BridgePeerError(f"{where}: failed after {elapsed:.1f}s (a peer died, raised or reset the "
                           f"connection): {type(cause).__name__}: {text}", op=op, seq=seq, stage=stage, group=group)


class BridgeWork(dist._Work):
    """A collective in flight. `wait()` raises the typed error of a failed collective.

    `group_state` is the owning group's `GroupState`: a waiter that gives up breaks the group (the
    executor may be stuck in an inner op that ignores its timeout), and a waiter whose job is still
    queued gives up as soon as the group is broken, since the job may then never start."""

    def __init__(self, op: str, seq: int, group: str, result: Any, timeout_s: float, grace_s: float,
                 group_state: "Optional[GroupState]" = None):
        super().__init__()
        self.op, self.seq, self.group = op, seq, group
        self._result = result
        self._event = threading.Event()
        self._error: Optional[BaseException] = None
        self._future = torch.futures.Future()
        self._timeout_s, self._grace_s = timeout_s, grace_s
        self._started: Optional[float] = None
        self._state = group_state

    # ---- executor side ----
    def _mark_started(self) -> None:
        self._started = time.monotonic()

    def _complete(self, error: Optional[BaseException] = None) -> None:
        self._error = error
        # The future first: a waiter woken by the event may read it at once (DDP chains on it).
        try:
            if error is None:
                self._future.set_result(self._result)
            else:
                self._future.set_exception(error)
        finally:
            self._event.set()

    # ---- user side ----
    def wait(self, timeout: Optional[timedelta] = None) -> bool:
        limit, limit_s = None, 0.0
        if isinstance(timeout, timedelta) and timeout.total_seconds() > 0:
            limit_s = timeout.total_seconds()
            limit = time.monotonic() + limit_s
        budget = self._timeout_s + self._grace_s
        while not self._event.is_set():
            now = time.monotonic()
            if self._started is None:
                # Queued behind earlier collectives, each bounded the same way; if the group broke
                # meanwhile this one may never start.
                broken = self._state.broken if self._state is not None else None
                if broken is not None:
                    raise BridgePeerError(f"group {self.group!r}, op {self.op} (collective #{self.seq}) never "
                                          f"started: the group broke before it: {broken}",
                                          op=self.op, seq=self.seq, group=self.group)
                deadline = limit if limit is not None else now + 0.5
            else:
                deadline = self._started + budget if limit is None else min(limit, self._started + budget)
            left = deadline - now
            if left <= 0 and (limit is not None or self._started is not None):
                err = BridgeTimeoutError(
                    f"group {self.group!r}, op {self.op} (collective #{self.seq}) did not complete within "
                    f"{limit_s if limit is not None and deadline == limit else budget:.1f}s"
                    f"{'' if self._started is not None else ' (still queued behind an earlier collective)'}",
                    op=self.op, seq=self.seq, group=self.group)
                if self._state is not None and (limit is None or deadline != limit):
                    self._state.break_(err)  # the group's own bound passed: nothing later can be trusted
                raise err
            self._event.wait(max(0.0, min(left, 0.5)))
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._event.is_set()

    def is_success(self) -> bool:
        return self._event.is_set() and self._error is None

    def exception(self):
        return self._error

    def result(self):
        self.wait()
        return self._result

    def get_future(self):
        return self._future

    def synchronize(self) -> None:
        self.wait()

    def source_rank(self) -> int:
        return -1


class GroupState:
    """Whether a group is broken (after a failed or timed-out collective) and what to do then."""

    def __init__(self, on_break: Optional[Callable[[BaseException], None]] = None):
        self.broken: Optional[BaseException] = None
        self._on_break = on_break
        self._lock = threading.Lock()

    def break_(self, err: BaseException) -> None:
        with self._lock:
            if self.broken is not None:
                return
            self.broken = err
        if self._on_break is not None:
            self._on_break(err)


# a submitted collective: (what to run, its work, how a raised error is typed)
_Job = tuple[Callable[[], Any], BridgeWork, Callable[[BaseException], BaseException]]


class Executor:
    """One thread per group that runs jobs in submission order, plus one that finishes point-to-point
    jobs: a send/recv job only issues its inner op (returns a `Handle`), so a rank's later jobs are
    not held up by a peer that posts its matching op late; the finisher waits for it."""

    def __init__(self, name: str, thread_init: Optional[Callable[[], None]] = None):
        self._init = thread_init
        self._q: "queue.Queue[Optional[_Job]]" = queue.Queue()
        self._p2p: "queue.Queue[Optional[tuple[Handle, BridgeWork, Callable]]]" = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name=f"hetero-{name}", daemon=True)
        self._finisher = threading.Thread(target=self._finish_loop, name=f"hetero-{name}-p2p", daemon=True)
        self._thread.start()
        self._finisher.start()

    def submit(self, fn: Callable[[], Any], work: BridgeWork, on_error: Callable[[BaseException], BaseException]
               ) -> BridgeWork:
        """Run `fn` in order; a raised error goes through `on_error` (typing, breaking the group)."""
        self._q.put((fn, work, on_error))
        return work

    def _run_init(self) -> Optional[BaseException]:
        try:
            if self._init is not None:
                self._init()
        except Exception as exc:  # e.g. the device cannot be made current: every job reports it
            return exc
        return None

    def _loop(self) -> None:
        init_error = self._run_init()
        while True:
            item = self._q.get()
            if item is None:
                self._p2p.put(None)
                return
            fn, work, on_error = item
            work._mark_started()
            try:
                if init_error is not None:
                    raise init_error
                res = fn()
            except BaseException as exc:
                work._complete(on_error(exc))
                continue
            if isinstance(res, Handle):
                self._p2p.put((res, work, on_error))
            else:
                work._complete()

    def _finish_loop(self) -> None:
        self._run_init()  # a failure here already failed the jobs in _loop
        while True:
            item = self._p2p.get()
            if item is None:
                return
            handle, work, on_error = item
            try:
                handle.wait()
            except BaseException as exc:
                work._complete(on_error(exc))
            else:
                work._complete()

    def shutdown(self) -> None:
        self._q.put(None)
