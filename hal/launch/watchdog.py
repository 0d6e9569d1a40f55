"""Ranks die with their launcher: whatever ends `hal` (SIGKILL included) ends torchrun and every rank
within seconds, so no orphan trains on in a run folder with no supervisor.

Three links, each enough on its own for its step of the chain:
- `hal` -> torchrun: torchrun is started with `die_with_parent` as its `preexec_fn`: the kernel sends
  it SIGKILL when `hal` dies (Linux `prctl(PR_SET_PDEATHSIG)`, via ctypes). Not SIGTERM: with SIGTERM, a
  test-bed node's torchrun (2 nodes, loaded machine) was still alive 10 s after its `hal` was killed
  (its graceful stop has no bound of ours); the ranks follow it at once by their own parent-death
  signal. (Ctrl-C / SIGTERM to a live `hal` end torchrun the same way: `call_supervised`.)
- torchrun -> rank: torchrun starts each rank in a session of its own, so a signal to `hal`'s process
  group never reaches it; `guard_rank()` (called by hal.launch.rank_entry before the target runs) sets
  the rank's own parent-death signal (SIGKILL when torchrun dies) and
- `hal` -> rank: starts a daemon thread that polls the launcher's pid (HAL_LAUNCHER_PID, set by `hal
  train`; its /proc start time guards against a reused pid) every POLL_S and ends the rank with exit
  code 143 (as SIGTERM) when the launcher is gone, in case torchrun outlives it.

On a test-bed host or a real node the chain is the same: each node's `hal train` is the parent of that
node's torchrun. Not Linux (no prctl): the thread still runs; `die_with_parent` does nothing.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from typing import Optional

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
POLL_S = 1.0


def set_parent_death_signal(sig: int) -> bool:
    """Ask the kernel to send `sig` to this process when its parent exits; False where not supported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(parent: int, sig: int = signal.SIGKILL) -> None:
    """A Popen `preexec_fn` (runs in the child before exec): `sig` when `parent` (the launcher's pid)
    dies; if it died already, before the prctl took effect, exit now."""
    set_parent_death_signal(sig)
    if os.getppid() != parent:
        os._exit(143)


def start_time(pid: int) -> Optional[str]:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]  # fields after "pid (comm)": field 22 is index 19


def alive(pid: int, started: Optional[str]) -> bool:
    """Process `pid` still exists and is the one that started at `started` (not a reused pid)."""
    now = start_time(pid)
    if now is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return started is None  # no /proc: the pid exists, the start time cannot be compared
    return started is None or now == started


def watch_launcher(pid: int, poll_s: float = POLL_S, on_gone=None) -> threading.Thread:
    """A daemon thread that ends this process (exit code 143) once `pid` is gone."""
    started = start_time(pid)

    def gone() -> None:
        print(f"[hal] the launcher (pid {pid}) is gone: ending rank {os.environ.get('RANK', '?')} "
              f"(pid {os.getpid()})", file=sys.stderr, flush=True)
        os._exit(143)

    def loop() -> None:
        while alive(pid, started):
            time.sleep(poll_s)
        (on_gone or gone)()

    t = threading.Thread(target=loop, name="hal-launcher-watchdog", daemon=True)
    t.start()
    return t


def guard_rank(environ=None) -> None:
    """In a rank under torchrun: SIGKILL when torchrun (the parent) dies, and the launcher watchdog
    when HAL_LAUNCHER_PID names the launching `hal`."""
    from hal import envs
    env = os.environ if environ is None else environ
    parent = os.getppid()
    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent or parent == 1:  # torchrun died before the prctl took effect
        os._exit(143)
    launcher = envs.HAL_LAUNCHER_PID.get(env)
    if launcher:
        watch_launcher(int(launcher))


class Terminated(SystemExit):
    """The launcher got SIGTERM: its job is stopped, then it exits 143."""


def call_supervised(cmd: list[str], env: dict, stderr=None) -> int:
    """`subprocess.call` for a launcher's torchrun, tied to this process: the child dies with it
    (SIGKILL via PR_SET_PDEATHSIG), and SIGTERM to this process ends the child too (Terminated, exit
    143). On Ctrl-C `subprocess.call` gives the child (which got the SIGINT as well) 0.25 s, then kills
    it, and the KeyboardInterrupt goes on up (the `hal` command exits 130); the ranks die with torchrun
    by their own parent-death signal. Through `subprocess.call`, so tests that record launches by
    replacing it see this one too."""
    import functools
    import subprocess

    def on_term(signum, frame):
        raise Terminated(143)
    main = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGTERM, on_term) if main else None
    try:
        return subprocess.call(cmd, env=env, stderr=stderr, preexec_fn=functools.partial(die_with_parent, os.getpid()))
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
