"""`hal train` as a job, one launch per case (2 emulated ranks, the tiny GPT at its smallest): a SIGKILLed
`hal` leaves no torchrun or rank of its run alive 10 s later (hal.launch.watchdog), and a full disk under
the run folder (a small tmpfs on its checkpoint folder) is the one line the console prints, `No space left
on device`, with the ranks' log kept."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _config(tmp_path: Path, steps: int, interval: int) -> Path:
    cfg = tmp_path / "train.toml"
    cfg.write_text(f"""seed = 3
steps = {steps}
global_batch = 4
timeout_s = 60
[model]
path = "{ROOT}/examples/models/tiny.toml"
overrides = {{ vocab = 256, seq = 16, layers = 1 }}
[data]
max_bytes = 16384
[optimizer]
warmup_steps = 1
[cluster]
emulate = "cuda:1,ascend:1"
[checkpoint]
interval = {interval}
[log]
dir = "{tmp_path / 'run'}"
val_interval = 0
val_batches = 1
print_interval = 1
""")
    return cfg


def _hal_train(cfg: Path, **kw) -> subprocess.Popen:
    env = {**os.environ, "HAL_TRAIN_PLAIN": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "hal.cli", "train", "--config", str(cfg)], cwd=ROOT, env=env,
                            start_new_session=True, text=True, **kw)


def _of_launcher(pid: int) -> list[int]:
    """Processes whose environment names `pid` as their launcher (its torchrun and ranks)."""
    mark = f"HAL_LAUNCHER_PID={pid}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if mark in f.read().split(b"\0"):
                        state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
                        if state != "Z":
                            out.append(int(entry))
            except OSError:
                continue
    return out


def test_sigkill_of_hal_ends_torchrun_and_every_rank_within_10_s(tmp_path):
    cfg = _config(tmp_path, steps=100_000, interval=0)
    p = _hal_train(cfg, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        for line in p.stdout:  # the ranks are training once a step is printed
            if "step " in line and "/100000" in line:
                break
            assert time.monotonic() < deadline, "no training step within 240 s"
        job = _of_launcher(p.pid)
        assert len(job) >= 3, f"expected torchrun and 2 ranks of launcher {p.pid}, found {job}"
        p.kill()
        p.wait(timeout=10)
        end = time.monotonic() + 10  # every one gone within 10 s (polled, so a quick end costs no sleep)
        while _of_launcher(p.pid) and time.monotonic() < end:
            time.sleep(0.2)
        left = _of_launcher(p.pid)
        assert not left, f"alive 10 s after SIGKILL of hal (pid {p.pid}): {left}"
    finally:
        if p.poll() is None:
            p.kill()
        for pid in _of_launcher(p.pid):
            os.kill(pid, signal.SIGKILL)


def test_a_full_disk_is_the_console_line(tmp_path):
    ck = tmp_path / "run" / "checkpoints"
    ck.mkdir(parents=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(ck)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN): {r.stderr.strip()}")
    try:
        p = _hal_train(_config(tmp_path, steps=2, interval=1), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = p.communicate(timeout=300)
    finally:
        subprocess.run(["umount", "-l", str(ck)], capture_output=True)
    assert p.returncode == 1, (p.returncode, out[-2000:], err[-2000:])
    first = [ln for ln in err.splitlines() if "first failing rank" in ln]
    assert len(first) == 1 and "No space left on device" in first[0], err[-3000:]
    assert (tmp_path / "run" / "ranks.log").is_file() and "full log of every rank" in err
    assert not (tmp_path / "run" / "torchelastic").exists()
