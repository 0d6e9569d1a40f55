"""`hal train` survives faults (hal/trainer/elastic.py): under torchrun with `--max-restarts`, a rank killed
mid-step or frozen mid-collective - a cuda rank and an ascend rank of an emulated cuda:2 + ascend:2
cluster, on either side of the bridge - makes the other ranks fail with a typed error, torchrun restarts
the job, and it resumes from the newest complete checkpoint, losing at most the steps since it; and when
a whole node is lost from an elastic job (`--nnodes 1:2`, two torchrun agents on this machine), the
restarted job re-plans with `plan.source = "auto"` for the smaller cluster, reshards the checkpoint and
finishes. Every chip is EMULATED on this CPU.

The rank faults are injected by the config's test-only `[debug]` section (hal/trainer/debug.py): `kill` makes the rank os._exit inside its
next bridge collective of that step, `freeze` makes it sleep there with its connections open. The node is
lost by SIGKILL of its torchrun agent and its ranks. Bounds: every job runs under a timeout and is killed
with its processes past it (no hang outlives the test); a freeze ends after the group timeout (timeout_s =
10 s) + HAL_BRIDGE_GRACE_S (1 s). Each restart pays torchrun's process start-up again (`import torch` per
rank on this machine), so the module runs 2 jobs: one with 2 faults and 2 restarts (a cuda rank killed,
an ascend rank - the first of its sub-cluster - frozen: each side of the bridge, each kind of fault), and
the elastic one (the ascend node killed)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ._hal_train_job import run_hal_train

ROOT = Path(__file__).resolve().parent.parent
JOB_LIMIT_S = 360


def _config(path: Path, run_dir: Path, emulate: str, plan: str = "even", steps: int = 12, faults: str = "") -> Path:
    path.write_text(f"""
seed = 3
steps = {steps}
global_batch = 8
backend = "hetero"
timeout_s = 10
[model]
path = "{ROOT / 'examples/models/tiny.toml'}"
overrides = {{ vocab = 256, seq = 32 }}
[data]
max_bytes = 1048576
[optimizer]
lr = 3e-3
warmup_steps = 2
[cluster]
emulate = "{emulate}"
[plan]
source = "{plan}"
pp = {2 if plan == "even" else 1}
num_microbatches = 2
[checkpoint]
interval = 2
[log]
dir = "{run_dir}"
val_interval = 0
print_interval = 1
plots = false
{faults}""")
    return path


def _faults(*entries: tuple[str, int, int, int]) -> str:
    """The `[debug]` section's faults: (action, rank, step, restart) each."""
    return "".join(f'[[debug.faults]]\naction = "{a}"\nrank = {r}\nstep = {s}\nrestart = {n}\n' for a, r, s, n in entries)


def _hal_train(config: Path, max_restarts: int) -> subprocess.CompletedProcess:
    return run_hal_train(config, max_restarts, JOB_LIMIT_S, HAL_BRIDGE_GRACE_S="1")


def _error_class(name: str):
    """A typed error of the bridge (hal.ccl_bridge.errors), of the emulated chips' CCL it drives (hal.emulation.shm:
    a DP group inside one sub-cluster is that CCL itself, the bridge passes it through) or of the contract's
    collective errors (hal.contract.errors: the trainer types its bookkeeping group's peer loss); None otherwise."""
    import hal.ccl_bridge.errors
    import hal.emulation.shm.errors
    from hal.contract.errors import HalError
    import hal.contract.errors
    cls = getattr(hal.ccl_bridge.errors, name, None) or getattr(hal.emulation.shm.errors, name, None) \
        or getattr(hal.contract.errors, name, None)  # e.g. CollectivePeerError from the trainer's own gloo group
    return cls if isinstance(cls, type) and issubclass(cls, HalError) else None


def _typed(name: str) -> bool:
    return _error_class(name) is not None


def _records(run_dir: Path) -> list[dict]:
    return sorted((json.loads(p.read_text()) for p in (run_dir / "faults").glob("*.json")), key=lambda r: r["time"])


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_kill_and_freeze_on_both_sides_restart_and_resume(tmp_path):
    run = tmp_path / "run"
    # job 0: cuda rank 1 killed in step 3; job 1: ascend rank 2 frozen in step 7 (an ascend rank killed: the
    # next test). Checkpoints every 2 steps.
    faults = _faults(("kill", 1, 3, 0), ("freeze", 2, 7, 1))
    res = _hal_train(_config(tmp_path / "f.toml", run, "cuda:2,ascend:2", steps=8, faults=faults), max_restarts=2)
    assert res.returncode == 0, res.stdout[-4000:]
    summary = json.loads((run / "summary.json").read_text())
    restarts = summary["restarts"]
    # each job failed after steps 2, 6 and resumed from the newest COMPLETE checkpoint: the one
    # written at that step, or - when the fault hit while that asynchronous save was still being written
    # (seen here: the killed rank never finished its part) - the one before it, one interval earlier
    assert [(r["attempt"], r["failed_at_step"]) for r in restarts] == [(1, 2), (2, 6)], restarts
    for r in restarts:
        assert r["resumed_from_step"] in (r["failed_at_step"], r["failed_at_step"] - 2), r
        assert r["steps_lost"] == r["failed_at_step"] - r["resumed_from_step"]
    assert summary["steps_lost"] == sum(r["steps_lost"] for r in restarts) and len(summary["recover_s"]) == 2
    assert all(r["restart_s"] > 0 and r["recovered_s"] >= r["restart_s"] for r in restarts)
    assert summary["end_step"] == 8 and summary["start_step"] == 6
    assert "restarted after a failure in step 3" in res.stdout and "hal train: recovered:" in res.stdout

    recs = _records(run)
    injected = [(r["attempt"], r["rank"], r["injected"]) for r in recs if "injected" in r]
    assert injected == [(0, 1, "kill"), (1, 2, "freeze")]
    failures = [r for r in recs if "error_type" in r]
    assert failures and all(_typed(r["error_type"]) for r in failures), failures
    # a frozen peer is found by the bound of the collective: another rank raised a typed timeout
    # (BridgeTimeoutError, or hal.emulation.shm's ShmTimeoutError in a group inside one sub-cluster: whichever
    # fires first, torchrun may stop the rest before they record)
    for attempt, victim in ((1, 2),):
        timed = [r for r in failures if r["attempt"] == attempt and r["rank"] != victim]
        assert any(issubclass(_error_class(r["error_type"]), TimeoutError) for r in timed), (attempt, timed)
    # the metrics say which job ran each step; the step at which a job is back where the failed one was
    # (the first step it runs when nothing was lost) carries the recovery record
    steps = _metrics(run)
    assert [s["step"] for s in steps if "restart" in s] == \
        [max(r["failed_at_step"], r["resumed_from_step"] + 1) for r in restarts]
    assert {s["attempt"] for s in steps} == {0, 1, 2}
    # a step redone after a restart gives bitwise the loss it gave the first time (resume is exact)
    first: dict = {}
    for s in steps:
        assert first.setdefault(s["step"], s["loss"]) == s["loss"], s
    assert sorted(first) == list(range(1, 9))


def _children(pid: int) -> list[int]:
    """Direct children of `pid` (torchrun starts its ranks in sessions of their own, so killing the agent's
    process group leaves them running: a node's failure is its agent AND its ranks)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _kill_node(proc: subprocess.Popen) -> None:
    for pid in [*_children(proc.pid), proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_node_lost_under_torchrun_elastic_replans_smaller_and_continues(tmp_path):
    """Two torchrun agents on this machine as two nodes of one elastic job (`--nnodes 1:2`, c10d
    rendezvous): node A runs 2 cuda ranks, node B 2 ascend ranks (each node knows only its own chip:
    HAL_EMULATE=<chip>). Node B - its agent and its ranks - is killed after step 4: node A's ranks fail
    with the bridge's typed error, A's torchrun restarts, the rendezvous completes with A alone, and the
    job re-plans (`auto`) for 2 cuda ranks, reshards the 4-rank checkpoint and finishes."""
    from hal.testing import free_port
    run = tmp_path / "run"
    config = _config(tmp_path / "e.toml", run, "", plan="auto", steps=10)
    config.write_text(config.read_text().replace('emulate = ""\n', ""))
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc-per-node", "2",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "hal-elastic-test",
           "--max-restarts", "1", "--rdzv-conf", "last_call_timeout=3,join_timeout=90", "--monitor-interval", "0.5",
           "-m", "hal.launch.rank_entry", "-m", "hal.trainer.loop", "--config", str(config)]
    base = {**os.environ, "PYTHONPATH": str(ROOT), "HAL_BRIDGE_GRACE_S": "1", "OMP_NUM_THREADS": "1"}
    logs = {n: open(tmp_path / f"{n}.log", "w") for n in "AB"}
    nodes = {}
    try:
        for name, chip in (("A", "cuda"), ("B", "ascend")):  # A first: it hosts the rendezvous store
            nodes[name] = subprocess.Popen(cmd, cwd=ROOT, env={**base, "HAL_EMULATE": chip}, stdout=logs[name],
                                           stderr=subprocess.STDOUT, start_new_session=True)
            time.sleep(2)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] \
                if (run / "metrics.jsonl").is_file() else []
            if steps and max(steps) >= 4:
                break
            assert nodes["A"].poll() is None, (tmp_path / "A.log").read_text()[-3000:]
            time.sleep(0.5)
        else:
            raise AssertionError("the 4-rank job did not reach step 4 within 240 s")
        _kill_node(nodes["B"])  # the ascend node is gone
        code = nodes["A"].wait(timeout=JOB_LIMIT_S)
    finally:
        for p in nodes.values():
            if p.poll() is None:
                _kill_node(p)
        for f in logs.values():
            f.close()
    out = (tmp_path / "A.log").read_text()
    summary = json.loads((run / "summary.json").read_text())  # written before the closing report
    (r,) = summary["restarts"]
    assert (r["world_before"], r["world_after"]) == (4, 2) and r["replanned"] and r["resharded"], r
    assert r["chips_before"] == "cuda,cuda,ascend,ascend" and r["chips_after"] == "cuda,cuda"
    assert r["steps_lost"] == r["failed_at_step"] - r["resumed_from_step"] and r["resumed_from_step"] >= 2
    assert summary["world"] == 2 and summary["end_step"] == 10
    others = [x for x in _records(run) if "error_type" in x]  # node A's ranks, when they got to record
    assert all(_typed(x["error_type"]) for x in others), others
    assert "topology from the ranks' own chips" in out and "resharded: written by 4 ranks" in out
    assert code == 0, out[-4000:]
