"""The first hour (issue 16), second part: `hal train` and `hal testbed run` go through the launching
commands' one validation pass (hal.launch.check) and report a failing rank once; the documented exit
codes of the launching commands hold; `hal conformance` says why checks were skipped. (`hal --help`
importing no torch is tests/test_cli_imports.py.)

Bad input runs through `hal.cli.main` in this process with `subprocess.call` replaced by a recorder,
so "no worker started" is checked, not assumed. Two jobs really run, each bounded: a `hal train` whose
ranks fail (2 emulated ranks, ~10 s) and, where this machine can build one (root, namespaces), a
2-host test bed whose rank 1 fails and then one that runs past --timeout.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hal.cli import main

ROOT = Path(__file__).resolve().parents[1]
HAL_MAIN = "import sys; from hal.cli import main; sys.exit(main(sys.argv[1:]))"  # the `hal` command
LAPTOP = str(ROOT / "examples" / "clusters" / "laptop-2x2.toml")
BIG = str(ROOT / "examples" / "clusters" / "h800-910b-32.toml")
MODEL = str(ROOT / "examples" / "models" / "tiny.toml")
CLEAN = ("HAL_EMULATE", "HAL_CLUSTER", "HAL_CHIP", "HAL_PLUGINS", "HAL_DISABLE_PLUGIN_AUTOLOAD", "HAL_CPU_CCL",
         "RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID")


@pytest.fixture
def launches(monkeypatch):
    """Clean chip environment; every subprocess.call recorded (and not run); returns 0 unless
    `launches.code` is set."""
    for k in CLEAN:
        monkeypatch.delenv(k, raising=False)

    class Calls(list):
        code = 0
    calls = Calls()

    def fake_call(cmd, *a, **kw):
        calls.append((cmd, kw.get("env")))
        return calls.code
    monkeypatch.setattr(subprocess, "call", fake_call)
    return calls


def _config(tmp_path: Path, cluster: str = 'emulate = "cuda:2,ascend:2"',
            global_batch: int = 16, vocab: int = 256, data: str = 'source = "stdlib"') -> str:
    p = tmp_path / "train.toml"
    p.write_text(textwrap.dedent(f"""\
        steps = 4
        global_batch = {global_batch}
        [model]
        path = "{MODEL}"
        overrides = {{ vocab = {vocab}, seq = 32 }}
        [data]
        {data}
        max_bytes = 65536
        [optimizer]
        warmup_steps = 1
        [cluster]
        {cluster}
        [log]
        dir = "{tmp_path / 'run'}"
        """))
    return str(p)


def _one_line(code, capsys, needles, prog="hal train"):
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, (code, out, err)
    assert len(lines) == 1, err
    assert "Traceback" not in out + err
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


# ---- hal train: bad input stops before torchrun, one line, exit 2 -----------------------------------
# (argv after `train --config CFG`, config keywords, environment, words the one line must contain)
TRAIN_CASES = [
    (["--steps", "0"], {}, {}, ["steps = 0"]),
    (["--stop-after", "0"], {}, {}, ["stop_after = 0"]),
    (["--stop-after", "9"], {}, {}, ["stop_after = 9", "exceeds steps = 4"]),
    ([], {"cluster": 'emulate = "foo:2"'}, {}, ["cluster.emulate = 'foo:2'", "train.toml", "'foo'", "known chips"]),
    ([], {"cluster": 'emulate = "cuda:2,,ascend:2"'}, {}, ["cluster.emulate", "item 2 is empty"]),
    ([], {"cluster": 'emulate = "cuda:-1"'}, {}, ["cluster.emulate = 'cuda:-1'", "count '-1'"]),
    ([], {"cluster": 'emulate = "cuda:300"'}, {}, ["ranks to start 300", "256"]),
    ([], {"cluster": ""}, {}, ["no cluster to train on", "cluster.emulate", "HAL_EMULATE"]),
    ([], {"cluster": ""}, {"HAL_EMULATE": "foo:2"}, ["HAL_EMULATE='foo:2'", "'foo'"]),
    ([], {"cluster": ""}, {"HAL_EMULATE": "cuda"}, ["HAL_EMULATE=cuda", "give counts"]),
    ([], {"cluster": ""}, {"HAL_CLUSTER": "/nonexistent/spec.toml"}, ["HAL_CLUSTER=/nonexistent/spec.toml"]),
    ([], {"cluster": ""}, {"HAL_CHIP": "foo"}, ["HAL_CHIP='foo'"]),
    ([], {}, {"HAL_PLUGINS": "nosuch"}, ["HAL_PLUGINS='nosuch'", "nosuch"]),
    ([], {"cluster": f'spec = "{BIG}"'}, {}, ["rank 0 of 32", "not natively available", "HAL_EMULATE=cuda"]),
    ([], {"global_batch": 15}, {}, ["global_batch = 15", "4 replicas"]),
    ([], {"vocab": 0}, {}, ["vocab = 0"]),
    ([], {"vocab": 128}, {}, ["the model's vocab = 128", "tokenizer's vocab is 256 tokens", "set model.overrides.vocab >= 256"]),
    ([], {"data": 'source = "files"\npaths = ["no/such/dir"]'}, {}, ["data.paths", "no/such/dir"]),
    (["--plan", "/nonexistent/plan.toml"], {}, {}, ["plan.file", "/nonexistent/plan.toml"]),
    (["--run-dir", "/etc/hostname"], {}, {}, ["--run-dir /etc/hostname", "is a file"]),
    (["--max-restarts", "-1"], {}, {}, ["--max-restarts -1"]),
    (["--max-restarts", "-1", "--measure-parts"], {}, {}, ["--max-restarts -1"]),
    ([], {}, {"HAL_CPU_CCL": "bogus"}, ["HAL_CPU_CCL='bogus'"]),
]


@pytest.mark.parametrize("argv,cfg,env,needles", TRAIN_CASES,
                         ids=[" ".join(c[0]) + " " + " ".join(f"{k}={v}" for k, v in {**c[1], **c[2]}.items())
                              for c in TRAIN_CASES])
def test_train_bad_input_stops_before_launch(argv, cfg, env, needles, tmp_path, launches, monkeypatch, capsys):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    code = main(["train", "--config", _config(tmp_path, **cfg), *argv])
    _one_line(code, capsys, needles)
    assert launches == [], "a worker was started"


def test_train_missing_config_is_one_line(launches, capsys):
    _one_line(main(["train", "--config", "no/such/train.toml"]), capsys, ["no/such/train.toml"])


def test_train_bad_cluster_spec_names_the_config_field(tmp_path, launches, capsys):
    spec = tmp_path / "spec.toml"
    spec.write_text('[[sub_clusters]]\nname = "a"\nchip = "cuda"\nnodes = 1\nranks_per_node = 2\nemulate = "yes"\n')
    code = main(["train", "--config", _config(tmp_path, cluster=f'spec = "{spec}"')])
    _one_line(code, capsys, [f"cluster.spec = '{spec}'", "spec.toml:6:", "emulate = 'yes'", "boolean"])
    assert launches == []


def test_train_world_size_comes_from_the_cluster_spec(tmp_path, launches, monkeypatch, capsys):
    # cluster.spec gives the ranks; a stray HAL_EMULATE in the shell does not override the config
    monkeypatch.setenv("HAL_EMULATE", "kunlun:3")
    monkeypatch.setenv("HAL_CHIP", "cuda")  # would bind cuda on every rank
    run_dir = tmp_path / "new" / "run"
    assert main(["train", "--config", _config(tmp_path, cluster=f'spec = "{LAPTOP}"'),
                 "--run-dir", str(run_dir)]) == 0
    (cmd, env), = launches
    assert cmd[cmd.index("--nproc-per-node") + 1] == "4"
    assert env["HAL_CLUSTER"] == LAPTOP and "HAL_EMULATE" not in env and "HAL_CHIP" not in env
    # the ranks start through hal.launch.rank_entry, which reports an uncaught error as one line
    i = cmd.index("hal.launch.rank_entry")
    assert cmd[i - 1] == "-m" and cmd[i + 1:i + 3] == ["-m", "hal.trainer.loop"]
    assert run_dir.is_dir(), "the run directory is created before launch"
    assert "cluster.spec" in capsys.readouterr().out


def test_train_exit_code_1_when_a_rank_fails_is_reported_once(tmp_path, launches, capsys):
    # the documented `1 a rank failed`: torchrun's code comes back, with the launcher's one report
    launches.code = 1
    assert main(["train", "--config", _config(tmp_path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "exited with code 1" in err[0] and err[1].endswith("ranks.log"), err


def test_train_on_a_finished_run_says_so_and_starts_nothing(tmp_path, launches, capsys):
    # a run folder whose newest complete checkpoint is the last step: nothing to train, no parts
    # measured again; the finished run's figures and how to start a new one
    import json
    cfg = _config(tmp_path)
    done = tmp_path / "run" / "checkpoints" / "step_00000004"
    done.mkdir(parents=True)
    (done / ".complete").write_text("")
    (tmp_path / "run" / "summary.json").write_text(json.dumps(
        {"final_val_loss": 2.5, "efficiency": 0.981, "even_efficiency": 0.52}))
    assert main(["train", "--config", cfg, "--measure-parts"]) == 0
    assert launches == []
    out = capsys.readouterr().out
    assert "finished at step 4 of 4" in out and "efficiency 98.1%" in out and "--run-dir" in out, out
    # a checkpoint short of the last step resumes as before (torchrun is started)
    done.rename(done.with_name("step_00000002"))
    assert main(["train", "--config", cfg]) == 0 and len(launches) == 1


def test_train_rank_failure_at_run_time_prints_the_first_failing_rank_once(tmp_path, monkeypatch):
    """A real job: a data folder that exists (the launcher checks that) but holds no text is refused by
    every rank when it builds the corpus, and the user reads that rank's one line, not torchrun's dump."""
    (tmp_path / "empty").mkdir()
    cfg = _config(tmp_path, cluster='emulate = "cuda:1,ascend:1"',
                  data=f'source = "files"\npaths = ["{tmp_path / "empty"}"]')
    env = {k: v for k, v in os.environ.items() if k not in CLEAN}
    p = subprocess.run([sys.executable, "-c", HAL_MAIN, "train", "--config", cfg], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=240)
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 1, p.stdout + p.stderr
    assert "Traceback" not in p.stderr and "ChildFailedError" not in p.stderr + p.stdout
    assert len(err) == 2, p.stderr
    assert err[0].startswith("hal train: error: first failing rank: rank=")
    assert "chip=cuda" in err[0] or "chip=ascend" in err[0]
    assert "DataError: " in err[0] and "too few for a train/validation split" in err[0], err[0]
    log = Path(err[1].split("full log of every rank: ")[1])
    assert log == tmp_path / "run" / "ranks.log" and "Traceback" in log.read_text()


def test_a_rank_reports_once_with_its_chip_from_the_cluster_spec(monkeypatch, capsys):
    # a job's own wrapper (hal.cli.demo_job.entry) and hal.launch.rank_entry around it: one line, not two
    from hal.launch.check import report_rank_failure
    for k in CLEAN:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("HAL_CLUSTER", LAPTOP)
    exc = RuntimeError("boom")
    report_rank_failure(exc)
    report_rank_failure(exc)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].endswith("rank=3 chip=ascend RuntimeError: boom"), lines


def test_a_rank_killed_by_a_signal_is_named_from_torchruns_root_cause(tmp_path, capsys):
    """No Python exception to report (SIGKILL, as the OOM killer sends): the launcher reads torchrun's
    own "Root Cause" block and prints that rank and signal once."""
    from hal.launch.check import run_ranks
    from hal.testing import free_port
    script = tmp_path / "ranks.py"
    script.write_text("import os, signal, time\n"
                      "if os.environ['RANK'] == '1': os.kill(os.getpid(), signal.SIGKILL)\n"
                      "time.sleep(1)\n")
    env = {k: v for k, v in os.environ.items() if k not in CLEAN}
    code = run_ranks("hal demo", [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                                  "--master-port", str(free_port()), str(script)], {**env, "OMP_NUM_THREADS": "1"})
    err = capsys.readouterr().err.splitlines()
    assert code == 1 and len(err) == 2, err
    assert err[0].startswith("hal demo: error: first failing rank (torchrun's root cause; it raised no Python "
                             "exception): rank=1 exitcode -9 "), err[0]
    assert "SIGKILL" in err[0]
    Path(err[1].split(": ")[-1]).unlink()


# ---- hal testbed run ---------------------------------------------------------------------------------
class _FakeSpec:
    def __init__(self, ranks, chips=()):
        self.ranks, self.chips, self.hosts = tuple(ranks), tuple(chips), len(ranks)
        self.world_size = sum(ranks)


class _FakeBed:
    name = "fake"

    def __init__(self, ranks, chips=()):
        self.spec = _FakeSpec(ranks, chips)

    def nic(self, i):
        return f"rail{i}"


@pytest.mark.parametrize("env,needles", [
    ({"HAL_EMULATE": "foo:4"}, ["HAL_EMULATE='foo:4'", "'foo'"]),
    ({"HAL_EMULATE": "cuda:3"}, ["test bed fake's rank count 4", "HAL_EMULATE='cuda:3' names 3 ranks"]),
    ({"HAL_CHIP": "foo"}, ["HAL_CHIP='foo'"]),
    ({"HAL_CHIP": "cuda"}, ["rank 0 of 4", "not natively available"]),
    ({"HAL_PLUGINS": "nosuch"}, ["HAL_PLUGINS='nosuch'"]),
    ({"HAL_CLUSTER": LAPTOP, "HAL_EMULATE": ""}, []),   # the spec's 4 ranks on a 4-rank bed: fine
    ({}, []),                                           # no chip variable: the machine's own chip
])
def test_testbed_run_checks_the_ranks_chip_environment(env, needles, launches, monkeypatch):
    from hal.launch.check import LaunchError
    from hal.cli.testbed import _check_chips
    bed = _FakeBed([2, 2])
    if not needles:
        _check_chips(bed, env)
        return
    with pytest.raises(LaunchError) as info:
        _check_chips(bed, env)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))


@pytest.mark.parametrize("argv,needles", [
    (["up", "--ranks", "2,x"], ["--ranks '2,x'"]),
    (["up", "--ranks", "0,2"], ["ranks[0]=0"]),
    (["up", "--loss", "2"], ["loss=2.0"]),
    (["up", "--rate", "banana"], ["rate='banana'"]),
    (["up", "--cluster", "/nonexistent/spec.toml"], ["/nonexistent/spec.toml"]),
    (["up", "--name", "bad name!"], ["name='bad name!'"]),
    (["run", "--timeout", "-1", "--", "x.py"], ["--timeout -1"]),
    (["run", "--env", "FOO", "--name", "nosuchbed", "--", "x.py"], ["--env 'FOO'", "K=V"]),
    (["run", "--name", "nosuchbed", "--", "x.py"], ["no test bed 'nosuchbed'"]),
    (["run", "--name", "nosuchbed"], ["give a target after --"]),
])
def test_testbed_bad_input_is_one_line(argv, needles, launches, capsys):
    _one_line(main(["testbed", *argv]), capsys, needles, prog="hal testbed")
    assert launches == []


def test_testbed_bed_chips_from_up_are_checked_too(launches):
    from hal.launch.check import LaunchError
    from hal.cli.testbed import _check_chips
    _check_chips(_FakeBed([1, 1], chips=("cuda", "ascend")), {})
    with pytest.raises(LaunchError, match="'foo'"):
        _check_chips(_FakeBed([1, 1], chips=("cuda", "foo")), {})


def _result(outputs, codes, timed_out=False):
    from hal.testbed.launch import HostRun, JobResult
    return JobResult(hosts=[HostRun(h, c, o) for h, (o, c) in enumerate(zip(outputs, codes))], seconds=1.0,
                     timed_out=timed_out)


def test_testbed_report_prints_the_first_failing_rank_once(capsys):
    from hal.cli.testbed import _report
    host0 = "[hal rank error] t=2.5 rank=0 chip=cuda BridgePeerError: peer 1 closed\nTraceback ...\n"
    host1 = ("[hal rank error] t=1.5 rank=1 chip=ascend ValueError: shape (4, 8) vs (4, 9)\nTraceback ...\n"
             "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ...\n")
    assert _report(_result([host0, host1], [1, 1]), 60) == 1
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and len(lines) == 2, err
    assert lines[0] == "hal testbed run: error: first failing rank: rank=1 chip=ascend ValueError: shape (4, 8) vs (4, 9)"
    log = Path(lines[1].split("full log of every rank: ")[1])
    assert "ChildFailedError" in log.read_text() and "===== host 1" in log.read_text()
    log.unlink()


def test_testbed_report_timeout_is_124_and_success_prints_every_host(capsys):
    from hal.cli.testbed import _report
    assert _report(_result(["half done\n", ""], [None, None], timed_out=True), 5) == 124
    err = capsys.readouterr().err.splitlines()
    assert "stopped after 5s (--timeout)" in err[0] and len(err) == 2
    Path(err[1].split(": ")[-1]).unlink()
    assert _report(_result(["rank 0 table\n", "rank 2 table\n"], [0, 0]), 5) == 0
    out = capsys.readouterr().out
    assert "===== host 0" in out and "rank 0 table" in out and "rank 2 table" in out


def test_rank_nic_reports_an_uncaught_error_as_one_marked_line(tmp_path):
    script = tmp_path / "target.py"
    script.write_text("raise ValueError('bad shape (4, 8) on this rank')\n")
    env = {k: v for k, v in os.environ.items() if k not in CLEAN}
    env.update(RANK="1", LOCAL_RANK="0", HAL_EMULATE="cuda:1,ascend:1", HAL_RANK_NICS="lo")
    p = subprocess.run([sys.executable, "-m", "hal.testbed.rank_nic", str(script)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    first = p.stderr.splitlines()[0]
    assert first.startswith("[hal rank error] t=")
    assert first.endswith("rank=1 chip=ascend ValueError: bad shape (4, 8) on this rank"), first
    assert "Traceback" in p.stderr  # the traceback stays, for the log


@pytest.fixture
def real_bed():
    """A 2-host bed (one rank each, cuda + ascend emulated) built by `hal testbed up`, taken down after."""
    from hal.testbed import TestbedUnavailable, check_available
    try:
        check_available()
    except TestbedUnavailable as exc:
        pytest.skip(f"test bed unavailable: {exc}")
    name = f"fh{os.getpid() % 100000}"
    assert main(["testbed", "up", "--ranks", "1,1", "--chips", "cuda:1,ascend:1", "--name", name]) == 0
    try:
        yield name
    finally:
        main(["testbed", "down", "--name", name])


def test_testbed_run_rank_failure_and_timeout_on_a_real_bed(real_bed, tmp_path, capsys, monkeypatch):
    for k in CLEAN:
        monkeypatch.delenv(k, raising=False)
    capsys.readouterr()
    script = tmp_path / "target.py"
    script.write_text("import os, time\n"
                      "if os.environ['RANK'] == '1': raise ValueError('bad shape (4, 8) on rank 1')\n"
                      "if os.environ.get('SLEEP'): time.sleep(300)\n")
    code = main(["testbed", "run", "--name", real_bed, "--timeout", "120", "--", str(script)])
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 1, out + err
    assert "Traceback" not in out + err and len(lines) == 2, err
    assert lines[0] == ("hal testbed run: error: first failing rank: rank=1 chip=ascend ValueError: "
                        "bad shape (4, 8) on rank 1")
    log = Path(lines[1].split("full log of every rank: ")[1])
    assert "Traceback" in log.read_text()
    log.unlink()
    # past --timeout: the job is stopped, exit 124 (rank 1 sleeps too: RANK 1 only fails without SLEEP)
    script.write_text("import time\ntime.sleep(300)\n")
    assert main(["testbed", "run", "--name", real_bed, "--timeout", "3", "--", str(script)]) == 124
    err = capsys.readouterr().err.splitlines()
    assert "stopped after 3s (--timeout)" in err[0]
    Path(err[1].split(": ")[-1]).unlink()


# ---- the other launching commands' documented exit codes ----------------------------------------------
@pytest.mark.parametrize("argv", [["demo", "--steps", "3"], ["bench", "comm", "--max-bytes", "8K"]])
def test_a_failed_job_returns_torchruns_code_with_one_report(argv, launches, capsys):
    # demo: `1 parity failed or a rank failed`; bench: torchrun's code. Either way one report, no dump.
    launches.code = 1
    assert main(argv) == 1 and len(launches) == 1
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 2 and "exited with code 1" in err[0] and "full log of every rank" in err[1], err
    Path(err[1].split(": ")[-1]).unlink(missing_ok=True)


def test_conformance_fail_on_skip_exits_1_and_says_why_checks_were_skipped(capsys):
    # documented: 0 no selected check failed (skipped ones listed with their reasons); --fail-on-skip: 1
    argv = ["conformance", "--plugin", "cpu", "--level", "collectives", "--nproc", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "multi-rank checks skipped: they need --nproc >= 2" in out
    n = int(re.search(r"skipped: (\d+) check\(s\), by reason:", out).group(1))  # every collectives check
    assert n > 400 and f" {n} x needs >= 2 ranks, --nproc is 1 (e.g. collectives." in out
    assert "no report file written" in out
    assert main(argv + ["--fail-on-skip"]) == 1
    assert f"--fail-on-skip and {n} check(s) skipped" in capsys.readouterr().out


def test_conformance_summary_says_where_the_report_went(tmp_path, capsys, monkeypatch):
    # and that a chip variable in the shell is not what it tests (it binds --plugin itself)
    monkeypatch.setenv("HAL_EMULATE", "ascend")
    target = tmp_path / "new" / "r.md"
    assert main(["conformance", "--plugin", "cpu", "--level", "contract", "-k", "registers",
                 "--report", str(target)]) == 0
    out = capsys.readouterr().out
    assert f"--report written to {target}" in out and target.is_file()
    assert "note: HAL_EMULATE=ascend ignored here: the suite tests --plugin cpu" in out
