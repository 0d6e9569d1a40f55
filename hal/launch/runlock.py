"""One job per run folder: an advisory lock (`fcntl.flock` on `<run dir>/.lock`) that `hal train` holds
for the job's life, with the holder's pid, host and start time written inside.

The kernel drops a flock when its last file descriptor closes, so the lock is released on any exit of
the holder (SIGKILL included) and a stale `.lock` file never blocks a later job. A second job on the
same folder gets `RunLocked` naming the holder (pid, host, since when) and exits 2 with nothing
started. The lock is advisory: only `hal train` takes it. On a shared file system (NFS) flock is
per-node on some setups; the holder recorded inside says which node held it.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Optional, Union

from hal.launch.check import LaunchError

LOCK_NAME = ".lock"


class RunLocked(LaunchError):
    """Another job holds the run folder's lock; the message names its pid and host."""


class RunLock:
    """The held lock of one run folder (`acquire` / `release`, or a `with` block)."""

    def __init__(self, run_dir: Union[str, Path]) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self._fd: Optional[int] = None

    def acquire(self) -> "RunLock":
        """Take the lock without waiting; RunLocked (naming the holder) when another job has it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise RunLocked(f"run folder {self.path.parent}: another job holds it ({holder}; lock file "
                            f"{self.path}); wait for it to end, stop it, or pass --run-dir DIR") from None
        os.set_inheritable(fd, False)  # torchrun and the ranks must not keep it after `hal` dies
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}).encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the descriptor drops the flock

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _holder(fd: int) -> str:
    """'pid P on host H since T' from the lock file (what the holder wrote), or what could be read."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info["since"])))
        return f"pid {info['pid']} on host {info['host']} since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a holder that has not written its pid and host yet"
