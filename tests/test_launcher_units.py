"""The launcher's pieces in-process (no torchrun): the run-folder lock, which node this is (flags,
Slurm variables, cluster.nodes), the pre-launch agreement of two nodes, a rank's root-cause line, the
per-launch ranks log, the config's environment for the ranks, and the launcher watchdog."""
from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hal.launch import nodes, rootcause, runlock, watchdog
from hal.launch.check import LaunchError
from hal.testing import free_port

ROOT = Path(__file__).resolve().parent.parent


# ---- one job per run folder -----------------------------------------------------------------------
def test_run_lock_refuses_a_second_holder_naming_pid_and_host_and_frees_on_release(tmp_path):
    import socket
    first = runlock.RunLock(tmp_path).acquire()
    with pytest.raises(runlock.RunLocked, match=rf"pid {os.getpid()} on host {socket.gethostname()}"):
        runlock.RunLock(tmp_path).acquire()  # a second open file description: flock conflicts
    first.release()
    runlock.RunLock(tmp_path).acquire().release()  # the stale .lock file blocks nothing


def test_run_lock_dies_with_its_holder_process(tmp_path):
    code = ("import sys, time; from hal.launch.runlock import RunLock; RunLock(sys.argv[1]).acquire(); "
            "print('held', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        with pytest.raises(runlock.RunLocked, match=rf"pid {p.pid} "):
            runlock.RunLock(tmp_path).acquire()
    finally:
        p.kill()  # SIGKILL: the kernel drops the flock with the process's descriptors
        p.wait(timeout=10)
    runlock.RunLock(tmp_path).acquire().release()


def test_hal_train_on_a_locked_run_folder_exits_2_naming_the_holder(tmp_path, capsys):
    from hal.cli import main
    cfg = tmp_path / "t.toml"
    cfg.write_text(f'steps = 4\nglobal_batch = 4\n[optimizer]\nwarmup_steps = 1\n[model]\npath = "{ROOT}/examples/models/tiny.toml"\n'
                   f'overrides = {{ vocab = 256, seq = 16 }}\n[cluster]\nemulate = "cuda:1,ascend:1"\n'
                   f'[log]\ndir = "{tmp_path}/run"\n')
    (tmp_path / "run").mkdir()
    with runlock.RunLock(tmp_path / "run"):
        assert main(["train", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "another job holds it" in err[0] and f"pid {os.getpid()}" in err[0], err


# ---- which node am I --------------------------------------------------------------------------------
@pytest.mark.parametrize("nodelist, first", [("a", "a"), ("hostA,hostB", "hostA"), ("node[01-04,07]", "node01"),
                                             ("gpu-[3-5],cpu1", "gpu-3"), ("r[7]x-ib", "r7x-ib")])
def test_first_host_of_slurm_nodelists(nodelist, first):
    assert nodes.first_host(nodelist) == first


def test_slurm_variables_give_node_rank_and_endpoint():
    env = {"SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_PROCID": "1", "SLURM_NTASKS": "2",
           "SLURM_JOB_NODELIST": "cn[12-13]"}
    n = nodes.resolve(None, None, None, [], env)
    assert (n.nnodes, n.node_rank, n.addr, n.port) == (2, 1, "cn12", nodes.DEFAULT_PORT)
    n = nodes.resolve(None, None, None, [], {**env, "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29999"})
    assert (n.addr, n.port) == ("10.0.0.5", 29999)
    with pytest.raises(LaunchError, match="srun --ntasks-per-node=1"):
        nodes.resolve(None, None, None, [], {**env, "SLURM_NTASKS": "8"})
    assert not nodes.resolve(None, None, None, [], {"SLURM_NNODES": "1", "SLURM_NODEID": "0"}).multi


def test_flags_and_cluster_nodes_give_the_node():
    n = nodes.resolve(2, 1, "10.1.2.3:1234", [], {})
    assert n.torchrun_args() == ["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.1.2.3",
                                 "--master-port", "1234"]
    with pytest.raises(LaunchError, match="--node-rank"):
        nodes.resolve(2, None, None, [], {})
    with pytest.raises(LaunchError, match=r"--node-rank 2 \(of --nnodes 2\)"):
        nodes.resolve(2, 2, "h", [], {})
    n = nodes.resolve(None, None, None, ["a.example:777", "b.example"], {}, hostname="b")
    assert (n.nnodes, n.node_rank, n.addr, n.port) == (2, 1, "a.example", 777)
    with pytest.raises(LaunchError, match="this host 'c' is not in the list"):
        nodes.resolve(None, None, None, ["a", "b"], {}, hostname="c")
    with pytest.raises(LaunchError, match="do not split evenly over 2 nodes"):
        nodes.ranks_on_node(3, nodes.resolve(2, 0, "h", [], {}))


def test_each_node_checks_only_its_own_ranks_native_chips(tmp_path):
    """A native mixed cluster: node 0 holds a native cpu rank, node 1 a native cuda rank (absent here).
    Node 0's pre-launch check passes (rank 1 is node 1's to check; before the fix it refused rank 1's
    cuda, as a single-machine launch must); node 1's names its own rank 1."""
    from hal.launch.check import plan_ranks
    spec = tmp_path / "native-mixed.toml"
    spec.write_text('name = "native-mixed"\n' + "".join(
        f'[[sub_clusters]]\nname = "{c}"\nchip = "{c}"\nnodes = 1\nranks_per_node = 1\nemulate = false\n'
        for c in ("cpu", "cuda")))
    env = {"HAL_CLUSTER": str(spec)}

    def on(rank: int):
        return plan_ranks(None, None, env, lambda n: "", local_ranks=nodes.local_ranks_of(
            nodes.resolve(2, rank, "h0:29400", [], {})))
    world, _, _, chips = on(0)
    assert (world, chips) == (2, [("cpu", False), ("cuda", False)])
    with pytest.raises(LaunchError, match=r"rank 1 of 2: chip 'cuda' .* not natively available"):
        on(1)
    assert list(nodes.node_ranks(5, nodes.resolve(2, 1, "h", [], {}), _Spec([0, 0, 0, 1, 1]))) == [3, 4]


class _Spec:
    """A cluster spec's node per rank, all `node_ranks` reads of one."""

    def __init__(self, node_of: list[int]):
        self.node_of, self.num_nodes = node_of, max(node_of) + 1

    def assignment(self, rank: int):
        return type("A", (), {"node": self.node_of[rank]})


def test_a_bad_input_on_one_node_stops_every_node_with_its_line():
    port = free_port()
    problems = {0: None, 1: "data.paths = '/x': no such file"}
    errors: dict[int, str] = {}

    def node(rank: int) -> None:
        try:
            nodes.agree(nodes.NodeLaunch(2, rank, "127.0.0.1", port - 1, "test"), problems[rank], 20.0)
        except LaunchError as exc:
            errors[rank] = str(exc)
    threads = [threading.Thread(target=node, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert set(errors) == {0, 1} and all(e.startswith("node 1 (") and "no such file" in e
                                         for e in errors.values()), errors


def test_a_node_that_never_reports_stops_the_other_in_bounded_time():
    t0 = time.monotonic()
    with pytest.raises(LaunchError, match=r"node\(s\) \[1\] of 2 did not report"):
        nodes.agree(nodes.NodeLaunch(2, 0, "127.0.0.1", free_port() - 1, "test"), None, 0.5)
    assert time.monotonic() - t0 < 15


def test_marker_seen_only_with_the_nonce(tmp_path):
    m = tmp_path / ".hal-shared-x"
    m.write_text('{"nonce": "abc"}')
    assert nodes.sees_marker(m, "abc", 0.0)
    assert not nodes.sees_marker(m, "other", 0.3, poll_s=0.1)
    assert not nodes.sees_marker(tmp_path / "missing", "abc", 0.0)


# ---- the one line a failing rank prints ---------------------------------------------------------
def test_root_cause_of_a_dcp_failure_is_the_disk_error():
    from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception
    try:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/run/ck/__0_0.distcp")
    except OSError as exc:
        inner = _wrap_exception(exc)
    dcp = CheckpointException("save failed", {1: inner, 0: inner})
    try:
        raise RuntimeError("saving the checkpoint of step 4 to /run/ck/step-4") from dcp
    except RuntimeError as outer:
        line = rootcause.one_line(outer)
    assert line.startswith("OSError: [Errno 28] No space left on device"), line
    assert "(raised as RuntimeError: saving the checkpoint of step 4" in line
    assert rootcause.one_line(dcp).endswith("(raised as CheckpointException)")
    assert rootcause.one_line(ValueError("plain")) == "ValueError: plain"


# ---- the launch's log, the config's environment --------------------------------------------------
def test_each_launch_gets_its_own_ranks_log(tmp_path):
    from hal.cli.train import ranks_log
    assert ranks_log(tmp_path).name == "ranks.log"
    (tmp_path / "ranks.log").write_text("first")
    assert ranks_log(tmp_path).name == "ranks.1.log"
    (tmp_path / "ranks.1.log").write_text("second")
    assert ranks_log(tmp_path).name == "ranks.2.log"
    assert ranks_log(tmp_path, node=1).name == "ranks-node1.log"  # nodes sharing the run folder


def test_the_config_sets_chips_and_timed_emulation_for_every_rank(tmp_path):
    from hal.trainer.args import config_env
    from hal.trainer.config import TrainConfig
    cfg = TrainConfig(steps=4, global_batch=4, optimizer={"warmup_steps": 1}, model={"path": str(ROOT / "examples/models/tiny.toml")},
                      cluster={"emulate": "cuda:2,ascend:2", "timed": True, "time_scale": 1000.0})
    env = config_env(cfg, {"HAL_CHIP": "cuda", "HAL_EMULATE": "cpu", "KEEP": "1"})
    assert env == {"HAL_EMULATE": "cuda:2,ascend:2", "HAL_EMULATE_TIMED": "1", "HAL_EMULATE_TIME_SCALE": "1000.0",
                   "KEEP": "1"}


# ---- ranks die with their launcher ----------------------------------------------------------------
def test_the_watchdog_ends_a_process_whose_launcher_is_gone():
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    code = ("import sys, time; from hal.launch.watchdog import watch_launcher; "
            "watch_launcher(int(sys.argv[1]), poll_s=0.1); time.sleep(60)")
    rank = subprocess.Popen([sys.executable, "-c", code, str(launcher.pid)], stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        assert rank.poll() is None
        launcher.kill()
        launcher.wait(timeout=10)
        assert rank.wait(timeout=10) == 143
        assert f"the launcher (pid {launcher.pid}) is gone" in rank.stderr.read()
    finally:
        for p in (launcher, rank):
            if p.poll() is None:
                p.kill()


def test_the_child_dies_with_its_launcher_and_ctrl_c_stops_it():
    # the launcher: call_supervised(sleep); SIGKILL it: its child gets SIGKILL from the kernel
    code = ("import sys; from hal.launch.watchdog import call_supervised; "
            "print(call_supervised([sys.executable, '-c', 'import time, os; print(os.getpid(), flush=True); "
            "time.sleep(60)'], dict(__import__('os').environ)))")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(p.stdout.readline())
    p.kill()
    p.wait(timeout=10)
    deadline = time.monotonic() + 10
    while watchdog.alive(child, None) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not watchdog.alive(child, None) or _zombie(child), "the child outlived its SIGKILLed launcher"
    # Ctrl-C on the launcher: the child is stopped and `hal` would exit 130 (hal.cli.main)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    child = int(p.stdout.readline())
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=20) != 0 and "KeyboardInterrupt" in p.stderr.read()
    assert not watchdog.alive(child, None) or _zombie(child)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_ctrl_c_exits_130(monkeypatch, capsys):
    import hal.cli.train
    from hal.cli import main

    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(hal.cli.train, "run", interrupted)
    assert main(["train", "--config", "x.toml"]) == 130
    assert capsys.readouterr().err.strip() == "hal train: interrupted"


def test_a_refusal_under_torchrun_is_the_ranks_marked_line(monkeypatch, capsys):
    from hal.launch.check import fail, first_rank_error
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "t")
    monkeypatch.setenv("RANK", "3")
    for k in ("HAL_EMULATE", "HAL_CHIP", "HAL_CLUSTER"):
        monkeypatch.delenv(k, raising=False)
    assert fail("hal train", LaunchError("data.paths = '/x': no such file")) == 2
    err = capsys.readouterr().err
    assert first_rank_error(err) == "rank=3 chip=? LaunchError: data.paths = '/x': no such file", err
