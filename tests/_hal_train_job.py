"""One bounded `hal train` job for the end-to-end trainer tests (faults, re-plan): `hal train --config C
--max-restarts N` in its own session (faults come from the config's test-only `[debug]` section), killed
with torchrun and every rank past `limit_s` (a hang fails the test, it never outlives it)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HAL_MAIN = "import sys; from hal.cli import main; sys.exit(main(sys.argv[1:]))"  # the `hal` command
# variables that would change the job under test if the caller's environment had them
_CLEARED = ("HAL_EMULATE", "HAL_EMULATE_TIMED", "HAL_CLUSTER")


def run_hal_train(config: Path, max_restarts: int, limit_s: float, **env_vars: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **env_vars)
    proc = subprocess.Popen([sys.executable, "-c", HAL_MAIN, "train", "--config", str(config),
                             "--max-restarts", str(max_restarts)], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and every rank with it
        out, _ = proc.communicate()
        raise AssertionError(f"hal train did not end within {limit_s} s (a hang):\n{out[-4000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")
