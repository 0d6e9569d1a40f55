"""`hal train` across the hosts of the test bed (hosts as namespaces, one shaped NIC per rank), every chip
emulated, timed emulation from the config, each run matched bit for bit against a single-host run of the
same config and plan: every step's loss and grad norm, the final validation loss, and every tensor of the
final checkpoint (parameters and optimizer state).

One bed of three hosts (BedSpec.of_sub_clusters: host 0 one cuda NIC, host 1 two cuda, host 2 two ascend)
and three launches, each carrying several of issue 24's cases:

- 2 hosts x 2 ranks (cuda host 1 + ascend host 2), the tiny GPT, one `hal train --nnodes 2 --node-rank h
  --rdzv-endpoint ... --max-restarts 1` per host. Rank 2 (host 2) freezes in step 3 (the test-only
  `[debug]` fault) after the step-2 checkpoint; host 2's `hal train` is SIGKILLed then and nothing of its
  job is left on the host within 10 s (as after a host crash); the same command started again on host 2
  passes the pre-launch agreement (node 0 still serves it), joins the job host 1's torchrun restarted into
  (hal.trainer.elastic.init_process_group's job number), resumes from the shared step-2 checkpoint and
  ends bit-identical to the uninterrupted reference.
- 3 hosts, the tiny MoE with expert parallel, a cluster spec with cuda spanning hosts 0 and 1 (one rank
  each) and ascend on host 2 (two ranks), one `hal train` per host under emulated Slurm variables
  (SLURM_NODEID, SLURM_NNODES, MASTER_ADDR/PORT; no node flags), bit-identical to the single-host run of
  the same spec.
- `hal testbed run` of `hal train` whose checkpoint folder host 1 cannot see (a tmpfs over it in host 1's
  own mount namespace): the one line printed is the failing rank's own (SharedFolderError naming node 1),
  not torchrun's "exitcode".
The two single-host references run (at once) while the bed comes up. Needs root and network namespaces
(skips with the reason otherwise).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from hal.testbed import BedSpec
from hal.testbed.launch import host_processes, launch

from ._testbed_fixture import make_bed_fixture

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
WALL = 900.0
GPT_HOSTS = (1, 2)  # the 2 x 2 run: host 1 (2 cuda) is node 0, host 2 (2 ascend) node 1
SPAN_SPEC = "".join(f'[[sub_clusters]]\nname = "{c}"\nchip = "{c}"\nnodes = {n}\nranks_per_node = {r}\nemulate = true\n'
                    for c, n, r in (("cuda", 2, 1), ("ascend", 1, 2)))

bed = make_bed_fixture(lambda: BedSpec.of_sub_clusters([("cuda", [1, 2]), ("ascend", [2])], rate="400 Mb/s"))


def _config(tmp: Path, name: str, model: str, cluster: str, steps: int, extra: str = "") -> Path:
    """A tiny run: timed emulation at a small time scale (charged time well below the compute), float32
    ops charged at the chips' bfloat16 rate (the 910B2 has no float32 figure)."""
    cfg = tmp / f"{name}.toml"
    cfg.write_text(f"""seed = 5
steps = {steps}
global_batch = 8
timeout_s = 300
[model]
path = "{ROOT}/examples/models/{model}.toml"
overrides = {{ vocab = 256, seq = 16, layers = 2 }}
[data]
max_bytes = 16384
[optimizer]
warmup_steps = 1
[cluster]
{cluster}
timed = true
time_scale = 1000.0
timed_dtype = "bfloat16"
[checkpoint]
interval = 2
[log]
dir = "{tmp / name}"
val_interval = 0
val_batches = 1
print_interval = 1
{extra}""")
    return cfg


def _gpt(tmp: Path, name: str, freeze: bool = False) -> Path:
    fault = '[[debug.faults]]\naction = "freeze"\nrank = 2\nstep = 3\nseconds = 100.0\n' if freeze else ""
    return _config(tmp, name, "tiny", 'emulate = "cuda:2,ascend:2"', 3, fault)


def _moe(tmp: Path, name: str) -> Path:
    spec = tmp / "span.toml"
    spec.write_text('name = "bed-span"\n' + SPAN_SPEC)
    return _config(tmp, name, "tiny-moe", f'spec = "{spec}"', 2, '[plan]\nsource = "even"\nep = true\n')


def _env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAL_EMULATE", "HAL_CLUSTER", "SLURM_", "MASTER_"))}
    return {**env, "HAL_TRAIN_PLAIN": "1", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "rail0", **(extra or {})}


def _train(cfg: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "hal.cli", "train", "--config", str(cfg), "--node-timeout", "120", *flags]


class _Started:
    """Processes started now and waited for later, each writing to its own log file."""

    def __init__(self) -> None:
        self.procs: dict = {}

    def start(self, key, popen, argv: list[str], env: dict, log: Path) -> subprocess.Popen:
        f = open(log, "w")
        p = popen(argv, cwd=str(ROOT), env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        f.close()
        self.procs[key] = (p, log)
        return p

    def wait(self, key, wall: float = WALL) -> tuple[int, str]:
        p, log = self.procs[key]
        try:
            p.wait(timeout=wall)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        return p.returncode, log.read_text(errors="replace")

    def tails(self, chars: int = 3000) -> str:
        return "\n".join(f"--- {k} (rc={p.poll()})\n{log.read_text(errors='replace')[-chars:]}"
                         for k, (p, log) in self.procs.items())

    def kill(self) -> None:
        for p, _ in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


@pytest.fixture(scope="module")
def refs(tmp_path_factory):
    """The single-host references (4 local ranks each), both started at once, before the bed comes up."""
    tmp = tmp_path_factory.mktemp("single")
    started = _Started()
    env = {k: v for k, v in _env().items() if k != "GLOO_SOCKET_IFNAME"}
    for name, cfg in (("gpt", _gpt(tmp, "gpt")), ("moe", _moe(tmp, "moe"))):
        started.start(name, subprocess.Popen, _train(cfg), env, tmp / f"{name}.log")

    def get(name: str) -> Path:
        code, out = started.wait(name)
        assert code == 0, out[-4000:]
        return tmp / name
    yield get
    started.kill()


# ---- what "the same run" means ----------------------------------------------------------------------
def _steps(run: Path) -> list[tuple]:
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [(s["step"], s["loss"], s["grad_norm"]) for s in recs if "loss" in s]


def _final_state(run: Path, step: int) -> dict:
    """Every model and optimizer entry of the final checkpoint, as bytes (DCP read in this process)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    with tempfile.TemporaryDirectory() as d:
        dcp_to_torch_save(run / "checkpoints" / f"step_{step:08d}", Path(d) / "state.pt")
        state = torch.load(Path(d) / "state.pt", weights_only=False)
    out = {}
    for k, v in state.items():
        if k.startswith(("model.", "optim.")):
            out[k] = (str(v.dtype), tuple(v.shape), v.contiguous().numpy().tobytes()) if torch.is_tensor(v) else v
    return out


def _check_same(run: Path, ref: Path, results: list[tuple[int, str]], steps: int) -> dict:
    assert all(code == 0 for code, _ in results), "\n".join(f"--- node {n} rc={c}\n{t[-3000:]}"
                                                          for n, (c, t) in enumerate(results))
    summary, want = (json.loads((r / "summary.json").read_text()) for r in (run, ref))
    assert summary["timed_emulation"], "cluster.timed = true did not reach the ranks"
    assert _steps(run) == _steps(ref) and len(_steps(ref)) == steps
    assert summary["final_val_loss"] == want["final_val_loss"]
    mine, theirs = _final_state(run, steps), _final_state(ref, steps)
    assert sorted(mine) == sorted(theirs) and any(k.startswith("model.") for k in mine)
    assert [k for k in mine if mine[k] != theirs[k]] == [], "final checkpoint entries differ"
    for n, (_, text) in enumerate(results):
        assert f"node {n} of {len(results)}" in text, text[-2000:]
    return summary


# ---- the launches -----------------------------------------------------------------------------------
def _hal_pid(bed, host: int, cfg: Path) -> int:
    pids = [pid for pid in host_processes(bed, host)
            if f"hal.cli\0train\0--config\0{cfg}\0".encode() in _cmdline(pid)]
    assert len(pids) == 1, pids
    return pids[0]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _live(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                out.append(pid)
        except OSError:
            pass
    return out


def _wait_file(path: Path, started: _Started, wall: float) -> None:
    end = time.monotonic() + wall
    while not path.exists():
        assert all(p.poll() is None for p, _ in started.procs.values()), \
            f"a node ended before {path} appeared:\n{started.tails()}"
        assert time.monotonic() < end, f"{path} did not appear within {wall:g} s:\n{started.tails()}"
        time.sleep(0.1)


def _kill_hal_and_wait_empty(bed, host: int, cfg: Path) -> None:
    """SIGKILL the host's `hal train`: its torchrun and ranks must end within 10 s (the watchdog)."""
    os.kill(_hal_pid(bed, host, cfg), signal.SIGKILL)
    end = time.monotonic() + 10
    while _live(host_processes(bed, host)) and time.monotonic() < end:
        time.sleep(0.1)
    left = {pid: _cmdline(pid).replace(b"\0", b" ")[:160] for pid in _live(host_processes(bed, host))}
    assert not left, f"host {host} still runs, 10 s after SIGKILL of its hal: {left}"


def test_two_hosts_per_host_commands_a_killed_host_resumes_bit_identical(refs, bed, tmp_path):
    cfg = _gpt(tmp_path, "gpt", freeze=True)
    port = 29700 + os.getpid() % 200
    argv = lambda n: _train(cfg, "--nnodes", "2", "--node-rank", str(n), "--max-restarts", "1",  # noqa: E731
                            "--rdzv-endpoint", f"{bed.spec.address(GPT_HOSTS[0], 0)}:{port}")
    started = _Started()
    try:
        for n, h in enumerate(GPT_HOSTS):
            started.start(n, lambda a, h=h, **kw: bed.popen(h, a, **kw), argv(n), _env(), tmp_path / f"node{n}.log")
        # rank 2 freezes in step 3: the step-2 checkpoint is complete, the run cannot end before the kill
        _wait_file(tmp_path / "gpt" / "checkpoints" / "step_00000002" / ".complete", started, WALL)
        _kill_hal_and_wait_empty(bed, GPT_HOSTS[1], cfg)
        started.start("again", lambda a, **kw: bed.popen(GPT_HOSTS[1], a, **kw), argv(1), _env(),
                      tmp_path / "node1-again.log")
        results = [started.wait(0), started.wait("again")]
    finally:
        started.kill()
        for h in GPT_HOSTS:
            for pid in host_processes(bed, h):
                os.kill(pid, signal.SIGKILL)
    summary = _check_same(tmp_path / "gpt", refs("gpt"), results, 3)
    assert summary["resumed"]["step"] == 2 and len(summary["restarts"]) == 1, summary.get("restarts")


def test_three_hosts_moe_spanning_sub_cluster_under_slurm_bit_identical(refs, bed, tmp_path):
    cfg = _moe(tmp_path, "moe")
    slurm = {"SLURM_JOB_ID": "42", "SLURM_NNODES": "3", "SLURM_NTASKS": "3", "MASTER_ADDR": bed.master_addr,
             "MASTER_PORT": str(29500 + os.getpid() % 200), "SLURM_JOB_NODELIST": "h[0-2]"}
    started = _Started()
    try:
        for h in range(3):
            started.start(h, lambda a, h=h, **kw: bed.popen(h, a, **kw), _train(cfg),
                          _env({**slurm, "SLURM_NODEID": str(h), "SLURM_PROCID": str(h)}), tmp_path / f"node{h}.log")
        results = [started.wait(h) for h in range(3)]
    finally:
        started.kill()
    _check_same(tmp_path / "moe", refs("moe"), results, 2)
    assert "Slurm" in results[1][1]
    summary = json.loads((tmp_path / "moe" / "summary.json").read_text())
    assert [(c["chip"], c["emulated"]) for c in summary["chips"]] == [("cuda", True)] * 2 + [("ascend", True)] * 2
    assert summary["plan"]["stages"][0]["experts"], "expert parallel: each rank holds its own experts"


def test_unshared_checkpoint_folder_is_the_failing_ranks_one_line(bed, tmp_path, capsys):
    """`hal testbed run` of `hal train` (every host's ranks) where host 1 sees another folder at the
    checkpoint path: the one line is the rank's SharedFolderError naming node 1, not "exitcode"."""
    from hal.cli.testbed import _report
    cfg = _config(tmp_path, "unshared", "tiny", 'emulate = "cuda:3,ascend:2"', 2)
    ck = tmp_path / "unshared" / "checkpoints"
    ck.mkdir(parents=True)
    r = bed.run(1, ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(ck)])  # host 1's mounts only
    assert r.returncode == 0, r.stderr
    try:
        job = launch(bed, ["-m", "hal.cli", "train", "--config", str(cfg)], cwd=str(ROOT),
                     env={"HAL_TRAIN_PLAIN": "1", "HAL_SHARED_DIR_WAIT_S": "2"})
        code = _report(job.wait(WALL, stop_after_failure=10.0), WALL)
    finally:
        bed.run(1, ["umount", "-l", str(ck)])
    err = capsys.readouterr().err
    first = [ln for ln in err.splitlines() if "first failing rank" in ln]
    assert code != 0 and len(first) == 1 and "exitcode" not in first[0], err
    assert "SharedFolderError" in first[0] and "node 1 (" in first[0] and "cannot see the marker" in first[0], first
