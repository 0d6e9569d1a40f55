"""`hal train` across the hosts of the test bed (hosts as namespaces, one shaped NIC per rank), every chip
emulated, timed emulation from the config, each run matched bit for bit against a single-host run of the
same config and plan: every step's loss and grad norm, the final validation loss, and every tensor of the
final checkpoint (parameters and optimizer state).

Three beds, so that runs go at once on hosts they do not share: `pair` and `pair2` (host 0 two cuda
NICs, host 1 two ascend: 2 hosts x 2 ranks) and `span` (BedSpec.of_sub_clusters: hosts 0 and 1 one cuda
NIC each, host 2 two ascend; the cluster spec SPAN_SPEC puts the cuda sub-cluster on two hosts). Both
models run on both layouts, each model by node flags once and under Slurm variables once:

- `pair`: the tiny GPT, one `hal train --nnodes 2 --node-rank n --rdzv-endpoint ... --max-restarts 1` per
  host, WITH a host crash: rank 2 (host 1) freezes in step 3 (the test-only `[debug]` fault) after the
  step-2 checkpoint; host 1's cables are pulled, the host is killed (`Testbed.kill_host`: SIGKILL to its
  pid-namespace init, every process of it at once: `hal train`, torchrun, both ranks, all listed before
  and all gone after), booted again (`boot_host`: a fresh pid namespace and /dev/shm) and its cables put
  back; the same command started again on it passes the pre-launch agreement (node 0 still serves it),
  joins the job node 0's torchrun restarted into (hal.trainer.elastic.init_process_group), resumes from
  the shared step-2 checkpoint and ends bit-identical to the uninterrupted reference.
  At once on `span`: the tiny MoE with expert parallel, one `hal train` per host under emulated Slurm
  variables (SLURM_NODEID, SLURM_NNODES, MASTER_ADDR/PORT; no node flags), then the tiny GPT by node
  flags; and from the crash on, on `pair2`, the tiny MoE under Slurm variables.
- then on `span`, `hal testbed run` of `hal train` whose checkpoint folder host 1 cannot see (a tmpfs
  over it in host 1's own mount namespace): the one line printed is the failing rank's own
  (SharedFolderError naming node 1), not torchrun's "exitcode".
The four single-host references run (all at once, `nice`d) while the beds come up and the runs go.
Needs root and network
namespaces (skips with the reason otherwise).
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
from typing import Callable

import pytest

from hal.testbed import BedSpec, TestbedSetupError
from hal.testbed.launch import host_processes, launch

from ._testbed_fixture import make_bed_fixture

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
WALL = 900.0
SPAN_SPEC = "".join(f'[[sub_clusters]]\nname = "{c}"\nchip = "{c}"\nnodes = {n}\nranks_per_node = {r}\nemulate = true\n'
                    for c, n, r in (("cuda", 2, 1), ("ascend", 1, 2)))
CRASHED = 1  # the `pair` host that crashes: node 1, both ascend ranks
# rendezvous port of each run (the agreement store takes port + 1): runs one after another on a bed
# never meet a port still held by the previous one
PORTS = {name: 29600 + os.getpid() % 200 * 2 + 400 * i for i, name in enumerate(("gpt-pair", "moe-span", "gpt-span",
                                                                             "moe-pair"))}



def _pair_spec() -> BedSpec:
    return BedSpec.of_sub_clusters([("cuda", [2]), ("ascend", [2])], rate="400 Mb/s")


pair = make_bed_fixture(_pair_spec, name="pair")
pair2 = make_bed_fixture(_pair_spec, name="pair2")
span = make_bed_fixture(lambda: BedSpec.of_sub_clusters([("cuda", [1, 1]), ("ascend", [2])], rate="400 Mb/s"),
                        name="span")


def _config(tmp: Path, name: str, model: str, cluster: str, steps: int, extra: str = "") -> Path:
    """A tiny run: timed emulation at a small time scale (charged time well below the compute), float32
    ops charged at the chips' bfloat16 rate (the 910B2 has no float32 figure); no PNG plots (scripted)."""
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
plots = false
{extra}""")
    return cfg


def _run_config(tmp: Path, name: str, freeze: bool = False) -> Path:
    """The config of run `name` = "<gpt|moe>-<pair|span>". The GPT on `pair` runs 3 steps (the crash
    comes in step 3, after the step-2 checkpoint); the others 2."""
    model, layout = name.split("-")
    if layout == "span":
        spec = tmp / "span.toml"
        spec.write_text('name = "bed-span"\n' + SPAN_SPEC)
        cluster = f'spec = "{spec}"'
    else:
        cluster = 'emulate = "cuda:2,ascend:2"'
    steps = 3 if name == "gpt-pair" else 2
    extra = '[plan]\nsource = "even"\nep = true\n' if model == "moe" else ""
    if freeze:
        extra += '[[debug.faults]]\naction = "freeze"\nrank = 2\nstep = 3\nseconds = 100.0\n'
    return _config(tmp, name, "tiny" if model == "gpt" else "tiny-moe", cluster, steps, extra)


def _env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAL_EMULATE", "HAL_CLUSTER", "SLURM_", "MASTER_"))}
    return {**env, "HAL_TRAIN_PLAIN": "1", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "rail0", **(extra or {})}


def _train(cfg: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "hal.cli", "train", "--config", str(cfg), "--node-timeout", "120", *flags]


def _by_flags(bed, cfg: Path) -> Callable[[int], tuple[list[str], dict]]:
    """Node n's command and environment: torchrun's node flags, node 0 = host 0."""
    end = f"{bed.spec.address(0, 0)}:{PORTS[cfg.stem]}"
    return lambda n: (_train(cfg, "--nnodes", str(bed.spec.hosts), "--node-rank", str(n), "--max-restarts", "1",
                             "--rdzv-endpoint", end), _env())


def _by_slurm(bed, cfg: Path) -> Callable[[int], tuple[list[str], dict]]:
    """Node n's command and environment under emulated `srun` variables (no node flags)."""
    slurm = {"SLURM_JOB_ID": "42", "SLURM_NNODES": str(bed.spec.hosts), "SLURM_NTASKS": str(bed.spec.hosts),
             "MASTER_ADDR": bed.master_addr, "MASTER_PORT": str(PORTS[cfg.stem]), "SLURM_JOB_NODELIST": f"h[0-{bed.spec.hosts - 1}]"}
    return lambda n: (_train(cfg), _env({**slurm, "SLURM_NODEID": str(n), "SLURM_PROCID": str(n)}))


class _Started:
    """Processes started now and waited for later, each writing to its own log file."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: dict = {}

    def start(self, key, popen, argv: list[str], env: dict) -> subprocess.Popen:
        log = self.logs / f"{'-'.join(map(str, key)) if isinstance(key, tuple) else key}.log"
        f = open(log, "w")
        p = popen(argv, cwd=str(ROOT), env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        f.close()
        self.procs[key] = (p, log)
        return p

    def start_nodes(self, name: str, bed, node: Callable[[int], tuple[list[str], dict]]) -> None:
        """One `hal train` per host of `bed` (node n on host n), keys (name, n)."""
        for n in range(bed.spec.hosts):
            argv, env = node(n)
            self.start((name, n), lambda a, h=n, **kw: bed.popen(h, a, **kw), argv, env)

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


def _kill_beds(*beds) -> None:
    for b in beds:
        for h in range(b.spec.hosts):
            for pid in host_processes(b, h):
                os.kill(pid, signal.SIGKILL)


REFS = ("gpt-pair", "moe-span", "moe-pair", "gpt-span")
REF_NICE = 5


@pytest.fixture(scope="module")
def refs(tmp_path_factory):
    """The single-host references (4 local ranks each), all started at once, before the beds come up, at
    a lower CPU priority (`nice`): they are needed only at the checks, the bed runs' crash and restart
    are the module's critical path (same results, less wall time)."""
    tmp = tmp_path_factory.mktemp("single")
    started = _Started(tmp)
    env = {k: v for k, v in _env().items() if k != "GLOO_SOCKET_IFNAME"}
    for name in REFS:
        started.start(name, subprocess.Popen, ["nice", "-n", str(REF_NICE), *_train(_run_config(tmp, name))], env)

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
    assert all(code == 0 for code, _ in results), "\n".join(f"--- {run.name} node {n} rc={c}\n{t[-3000:]}"
                                                          for n, (c, t) in enumerate(results))
    summary, want = (json.loads((r / "summary.json").read_text()) for r in (run, ref))
    assert summary["timed_emulation"], f"{run.name}: cluster.timed = true did not reach the ranks"
    assert _steps(run) == _steps(ref) and len(_steps(ref)) == steps, (run.name, _steps(run), _steps(ref))
    assert summary["final_val_loss"] == want["final_val_loss"], run.name
    mine, theirs = _final_state(run, steps), _final_state(ref, steps)
    assert sorted(mine) == sorted(theirs) and any(k.startswith("model.") for k in mine), run.name
    assert [k for k in mine if mine[k] != theirs[k]] == [], f"{run.name}: final checkpoint entries differ"
    for n, (_, text) in enumerate(results):
        assert f"node {n} of {len(results)}" in text, text[-2000:]
    return summary


def _check_moe(run: Path, ref: Path, results: list[tuple[int, str]], layout: str) -> None:
    summary = _check_same(run, ref, results, 2)
    assert [(c["chip"], c["emulated"]) for c in summary["chips"]] == [("cuda", True)] * 2 + [("ascend", True)] * 2
    assert summary["plan"]["stages"][0]["experts"], f"{layout}: expert parallel: each rank holds its own experts"
    assert all("Slurm" in text for _, text in results), f"{layout}: not launched from the Slurm variables"


# ---- the host crash ---------------------------------------------------------------------------------
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


def _kind(cmd: bytes, cfg: Path) -> str:
    """What a process of the job is: its `hal train`, torchrun, or a rank (torchrun's child)."""
    if f"hal.cli\0train\0--config\0{cfg}\0".encode() in cmd:
        return "hal"
    if b"torch.distributed.run\0" in cmd:
        return "torchrun"
    return "rank" if b"hal.launch.rank_entry\0" in cmd else f"other: {cmd[:120]!r}"


def _crash_host(bed, host: int, cfg: Path) -> None:
    """The host crashes with its cables pulled (peers hear no FIN/RST from it) and boots again: every
    process of it, `hal train` of `cfg` with its torchrun and ranks among them, gone at once."""
    job = {pid: _cmdline(pid) for pid in host_processes(bed, host)}
    kinds = [_kind(cmd, cfg) for cmd in job.values()]
    assert sorted(kinds) == sorted(["hal", "torchrun"] + ["rank"] * bed.spec.ranks[host]), \
        {p: c.replace(b"\0", b" ")[:160] for p, c in job.items()}
    nics = range(bed.spec.ranks[host])
    for i in nics:
        bed.link_down(host, i)
    try:
        killed = bed.kill_host(host)
        bed.boot_host(host)
    finally:
        for i in nics:
            bed.link_up(host, i)
    assert set(job) <= set(killed) and not _live(list(job)), f"host {host}: job pids alive after the crash"
    assert host_processes(bed, host) == [], f"host {host} runs something right after its boot"
    with pytest.raises(TestbedSetupError, match=f"host {host} of bed {bed.name} still runs"):
        bed.boot_host(host)


def _cmd_host(bed, host: int):
    return lambda a, **kw: bed.popen(host, a, **kw)


def _ended(started: _Started, name: str, bed) -> bool:
    return all(started.procs[(name, n)][0].poll() is not None for n in range(bed.spec.hosts))


def _schedule(started: _Started, events: list[tuple[Callable[[], bool], Callable[[], None]]]) -> None:
    """Bounded wait (WALL) that runs each event's action once its condition holds, in whichever order
    they come."""
    pending = list(events)
    end = time.monotonic() + WALL
    while pending:
        for ev in [ev for ev in pending if ev[0]()]:
            ev[1]()
            pending.remove(ev)
        assert time.monotonic() < end, f"{len(pending)} event(s) not come within {WALL:g} s:\n{started.tails()}"
        time.sleep(0.1)


def test_both_models_both_layouts_a_crashed_host_resumes_bit_identical(refs, pair, pair2, span, tmp_path):
    """`pair`: the tiny GPT by node flags; host 1 crashes after the step-2 checkpoint and resumes. At
    once on `span`: the tiny MoE under Slurm variables, then the tiny GPT by node flags; and from the
    crash on, on `pair2`: the tiny MoE under Slurm variables."""
    names = ("gpt-pair", "moe-span", "gpt-span", "moe-pair")
    gpt, moe3, gpt3, moe = (_run_config(tmp_path, n, freeze=n == "gpt-pair") for n in names)
    ckpt = tmp_path / "gpt-pair" / "checkpoints" / "step_00000002" / ".complete"

    def checkpointed() -> bool:   # rank 2 freezes in step 3: the run cannot end before the crash
        if ckpt.exists():
            return True
        assert all(started.procs[("gpt-pair", n)][0].poll() is None for n in range(2)), \
            f"a gpt-pair node ended before {ckpt} appeared:\n{started.tails()}"
        return False

    def crash() -> None:
        _crash_host(pair, CRASHED, gpt)
        started.start(("gpt-pair", "again"), _cmd_host(pair, CRASHED), *_by_flags(pair, gpt)(CRASHED))
        started.start_nodes("moe-pair", pair2, _by_slurm(pair2, moe))
    started = _Started(tmp_path)
    try:
        started.start_nodes("gpt-pair", pair, _by_flags(pair, gpt))
        started.start_nodes("moe-span", span, _by_slurm(span, moe3))
        _schedule(started, [(checkpointed, crash),
                            (lambda: _ended(started, "moe-span", span),
                             lambda: started.start_nodes("gpt-span", span, _by_flags(span, gpt3)))])
        results = {name: [started.wait((name, n)) for n in range(bed.spec.hosts)]
                   for name, bed in (("moe-span", span), ("gpt-span", span), ("moe-pair", pair2))}
        results["gpt-pair"] = [started.wait(("gpt-pair", 0)), started.wait(("gpt-pair", "again"))]
    finally:
        started.kill()
        _kill_beds(pair, pair2, span)
    summary = _check_same(tmp_path / "gpt-pair", refs("gpt-pair"), results["gpt-pair"], 3)
    assert summary["resumed"]["step"] == 2 and len(summary["restarts"]) == 1, summary.get("restarts")
    _check_moe(tmp_path / "moe-span", refs("moe-span"), results["moe-span"], "span")
    _check_moe(tmp_path / "moe-pair", refs("moe-pair"), results["moe-pair"], "pair")
    summary = _check_same(tmp_path / "gpt-span", refs("gpt-span"), results["gpt-span"], 2)
    assert [c["chip"] for c in summary["chips"]] == ["cuda", "cuda", "ascend", "ascend"]


def test_unshared_checkpoint_folder_is_the_failing_ranks_one_line(span, tmp_path, capsys):
    """`hal testbed run` of `hal train` (every host's ranks) where host 1 sees another folder at the
    checkpoint path: the one line is the rank's SharedFolderError naming node 1, not "exitcode"."""
    from hal.cli.testbed import _report
    cfg = _config(tmp_path, "unshared", "tiny", 'emulate = "cuda:2,ascend:2"', 2)
    ck = tmp_path / "unshared" / "checkpoints"
    ck.mkdir(parents=True)
    r = span.run(1, ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(ck)])  # host 1's mounts only
    assert r.returncode == 0, r.stderr
    try:
        job = launch(span, ["-m", "hal.cli", "train", "--config", str(cfg)], cwd=str(ROOT),
                     env={"HAL_TRAIN_PLAIN": "1", "HAL_SHARED_DIR_WAIT_S": "2"})
        code = _report(job.wait(WALL, stop_after_failure=10.0), WALL)
    finally:
        span.run(1, ["umount", "-l", str(ck)])
    err = capsys.readouterr().err
    first = [ln for ln in err.splitlines() if "first failing rank" in ln]
    assert code != 0 and len(first) == 1 and "exitcode" not in first[0], err
    assert "SharedFolderError" in first[0] and "node 1 (" in first[0] and "cannot see the marker" in first[0], first
