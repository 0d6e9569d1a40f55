"""`hal train` across two emulated hosts of the test bed (hosts as namespaces, one shaped NIC per rank):
host 0 holds 2 emulated cuda ranks, host 1 2 emulated ascend ranks, timed emulation from the config.

- one `hal train --nnodes 2 --node-rank h --rdzv-endpoint ...` per host trains the tiny GPT and matches a
  single-host run of the same config and plan bit for bit (every step's loss and grad norm, the final
  validation loss), with the timed emulation the config asks for;
- the same once per host under emulated Slurm variables (SLURM_NODEID, SLURM_NNODES,
  SLURM_JOB_NODELIST), no node flags;
- a SIGKILLed `hal` on host 1 leaves no process of its job on that host within 10 s;
- a host that sees another folder at the checkpoint path (a tmpfs mounted there in host 1's own mount
  namespace) is named in the one line every node prints (SharedFolderError);
- `hal testbed run` of `hal train` with a bad config prints that rank's one line.
Needs root and network namespaces (skips with the reason otherwise). Not yet here: the tiny MoE, a
3-host bed with a sub-cluster on two hosts, a host killed mid-run resuming with --max-restarts.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hal.testbed import BedSpec
from hal.testbed.launch import host_processes, launch

from ._testbed_fixture import make_bed_fixture

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
WALL = 300.0

bed = make_bed_fixture(lambda: BedSpec.of([2, 2], rate="400 Mb/s", chips=["cuda", "cuda", "ascend", "ascend"]))


def _config(tmp_path: Path, name: str) -> Path:
    cfg = tmp_path / f"{name}.toml"
    cfg.write_text(f"""seed = 5
steps = 3
global_batch = 8
timeout_s = 60
[model]
path = "{ROOT}/examples/models/tiny.toml"
overrides = {{ vocab = 256, seq = 16, layers = 2 }}
[data]
max_bytes = 16384
[optimizer]
warmup_steps = 1
[cluster]
emulate = "cuda:2,ascend:2"
timed = true
time_scale = 100000.0
[checkpoint]
interval = 2
[log]
dir = "{tmp_path / name}"
val_interval = 0
val_batches = 1
print_interval = 1
""")
    return cfg


def _env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAL_EMULATE", "SLURM_", "MASTER_"))}
    return {**env, "HAL_TRAIN_PLAIN": "1", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "rail0", **(extra or {})}


def _per_host(bed, argv_of, env_of, wall: float = WALL) -> list[tuple[int, str]]:
    procs = [bed.popen(h, argv_of(h), cwd=str(ROOT), env=env_of(h), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True) for h in range(2)]
    out = []
    for p in procs:
        try:
            text, _ = p.communicate(timeout=wall)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        out.append((p.returncode, text))
    return out


def _record(run: Path) -> tuple:
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    summary = json.loads((run / "summary.json").read_text())
    return [(s["step"], s["loss"], s["grad_norm"]) for s in steps if "loss" in s], summary["final_val_loss"]


@pytest.fixture(scope="module")
def single_host(tmp_path_factory):
    """The reference: the same config trained by one `hal train` on this machine (4 local ranks)."""
    tmp = tmp_path_factory.mktemp("single")
    r = subprocess.run([sys.executable, "-m", "hal.cli", "train", "--config", str(_config(tmp, "run"))], cwd=ROOT,
                       env={k: v for k, v in _env().items() if k != "GLOO_SOCKET_IFNAME"}, capture_output=True, text=True, timeout=WALL)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return _record(tmp / "run")


def _check_same(run: Path, single_host, results) -> None:
    assert all(code == 0 for code, _ in results), "\n".join(f"--- host {h} rc={c}\n{t[-3000:]}"
                                                          for h, (c, t) in enumerate(results))
    assert _record(run) == single_host
    summary = json.loads((run / "summary.json").read_text())
    assert summary["timed_emulation"], "cluster.timed = true did not reach the ranks"
    assert "node 1 of 2" in results[1][1] and "node 0 of 2" in results[0][1]


def test_one_command_per_host_matches_a_single_host_run(bed, tmp_path, single_host):
    cfg = _config(tmp_path, "flags")
    port = 29700 + os.getpid() % 200
    argv = lambda h: [sys.executable, "-m", "hal.cli", "train", "--config", str(cfg), "--nnodes", "2",  # noqa: E731
                      "--node-rank", str(h), "--rdzv-endpoint", f"{bed.master_addr}:{port}", "--node-timeout", "120"]
    _check_same(tmp_path / "flags", single_host, _per_host(bed, argv, lambda h: _env()))


def test_once_per_host_under_slurm_variables(bed, tmp_path, single_host):
    cfg = _config(tmp_path, "slurm")
    slurm = {"SLURM_JOB_ID": "42", "SLURM_NNODES": "2", "SLURM_NTASKS": "2", "MASTER_ADDR": bed.master_addr,
             "MASTER_PORT": str(29500 + os.getpid() % 200), "SLURM_JOB_NODELIST": "h[0-1]"}
    argv = lambda h: [sys.executable, "-m", "hal.cli", "train", "--config", str(cfg), "--node-timeout", "120"]  # noqa: E731
    env = lambda h: _env({**slurm, "SLURM_NODEID": str(h), "SLURM_PROCID": str(h)})  # noqa: E731
    _check_same(tmp_path / "slurm", single_host, _per_host(bed, argv, env))


def test_sigkill_of_hal_on_a_host_ends_its_job_there(bed, tmp_path):
    cfg = _config(tmp_path, "kill")
    port = 29900 + os.getpid() % 90
    argv = lambda h: [sys.executable, "-m", "hal.cli", "train", "--config", str(cfg), "--steps", "100000",  # noqa: E731
                      "--nnodes", "2", "--node-rank", str(h), "--rdzv-endpoint", f"{bed.master_addr}:{port}"]
    procs = [bed.popen(h, argv(h), cwd=str(ROOT), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True) for h in range(2)]
    try:
        deadline = time.monotonic() + WALL
        for line in procs[0].stdout:
            if "step " in line and "/100000" in line:
                break
            assert time.monotonic() < deadline, "no training step"
        hal_pids = [pid for pid in host_processes(bed, 1) if b"hal.cli\0train" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(hal_pids) == 1, hal_pids
        os.kill(hal_pids[0], signal.SIGKILL)
        end = time.monotonic() + 10
        while _live(host_processes(bed, 1)) and time.monotonic() < end:
            time.sleep(0.2)
        left = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:160] for pid in
                _live(host_processes(bed, 1))}
        assert not left, f"host 1 still runs, 10 s after SIGKILL of its hal: {left}"
    finally:
        for h, p in enumerate(procs):
            if p.poll() is None:
                p.kill()
            for pid in host_processes(bed, h):
                os.kill(pid, signal.SIGKILL)
            p.wait(timeout=10)


def _live(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                out.append(pid)
        except OSError:
            pass
    return out


def test_testbed_run_prints_a_failing_ranks_one_line(bed, tmp_path, capsys):
    from hal.cli.testbed import _report
    bad = tmp_path / "bad.toml"
    bad.write_text(_config(tmp_path, "bad").read_text().replace("steps = 3", "steps = 3\nlr_typo = 1"))
    job = launch(bed, ["-m", "hal.cli", "train", "--config", str(bad)], env={"HAL_TRAIN_PLAIN": "1"}, cwd=str(ROOT))
    code = _report(job.wait(120, stop_after_failure=10.0), 120)
    err = capsys.readouterr().err
    first = [ln for ln in err.splitlines() if "first failing rank" in ln]
    assert code != 0 and len(first) == 1 and "lr_typo" in first[0] and "exitcode" not in first[0], err


def test_a_node_that_cannot_see_the_checkpoint_folder_is_named(bed, tmp_path):
    cfg = _config(tmp_path, "unshared")
    ck = tmp_path / "unshared" / "checkpoints"
    ck.mkdir(parents=True)
    r = bed.run(1, ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(ck)])  # host 1's mounts only
    assert r.returncode == 0, r.stderr
    port = 29600 + os.getpid() % 90
    argv = lambda h: [sys.executable, "-m", "hal.cli", "train", "--config", str(cfg), "--nnodes", "2",  # noqa: E731
                      "--node-rank", str(h), "--rdzv-endpoint", f"{bed.master_addr}:{port}"]
    try:
        results = _per_host(bed, argv, lambda h: _env({"HAL_SHARED_DIR_WAIT_S": "2"}))  # the marker's wait
    finally:
        bed.run(1, ["umount", "-l", str(ck)])
    for code, text in results:
        first = [ln for ln in text.splitlines() if "first failing rank" in ln]
        assert code == 1 and len(first) == 1, text[-3000:]
        assert "SharedFolderError" in first[0] and "node 1 (" in first[0] and "cannot see the marker" in first[0], first
