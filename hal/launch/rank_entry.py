"""A torchrun rank's entry point that reports its own failure for the launcher:

    torchrun ... -m hal.launch.rank_entry -m hal.trainer.loop --config train.toml

first ties the rank's life to its launcher (hal.launch.watchdog.guard_rank: SIGKILL when torchrun dies,
exit when the `hal` named by HAL_LAUNCHER_PID is gone), then runs the target as `__main__`
(hal.launch.check.run_target); an uncaught exception is printed as one marked line (rank, chip,
exception type and message) before its traceback, so the launching command prints the first failing
rank's error once instead of torchrun's per-rank dump. The target is started by name, so `hal`
imports nothing above it.
"""
from __future__ import annotations

import sys

from hal.launch.check import run_target
from hal.launch.watchdog import guard_rank

if __name__ == "__main__":
    guard_rank()
    run_target(sys.argv[1:])
