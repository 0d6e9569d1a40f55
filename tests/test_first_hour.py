"""The first hour (issue 16): bad input to a launching command stops before torchrun starts, with one
line on stderr naming the flag or variable and its value, exit code 2 and no traceback; a failing
rank is reported once by the launcher; and the commands do what their help says.

Every bad-input case runs through `hal.cli.main` in this process with `subprocess.call` replaced by a
recorder, so "no worker started" is checked, not assumed, and no torchrun is launched.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hal.cli import main

ROOT = Path(__file__).resolve().parents[1]
HAL_MAIN = "import sys; from hal.cli import main; sys.exit(main(sys.argv[1:]))"  # the `hal` command
LAPTOP = str(ROOT / "examples" / "clusters" / "laptop-2x2.toml")
CLEAN = ("HAL_EMULATE", "HAL_CLUSTER", "HAL_CHIP", "HAL_PLUGINS", "HAL_DISABLE_PLUGIN_AUTOLOAD", "HAL_CPU_CCL")


@pytest.fixture
def launches(monkeypatch):
    """Clean chip environment; every subprocess.call recorded (and not run)."""
    for k in CLEAN:
        monkeypatch.delenv(k, raising=False)
    calls: list = []

    def fake_call(cmd, *a, **kw):
        calls.append((cmd, kw.get("env")))
        return 0
    monkeypatch.setattr(subprocess, "call", fake_call)
    return calls


def _bad_spec(tmp_path: Path, body: str) -> str:
    p = tmp_path / "spec.toml"
    p.write_text('[[sub_clusters]]\nname = "a"\nchip = "cuda"\nnodes = 1\n' + body)
    return str(p)


# (argv, environment, words the one line must contain)
CASES = [
    (["demo", "--nproc", "0"], {}, ["--nproc 0"]),
    (["demo", "--timeout", "0"], {}, ["--timeout 0"]),
    (["demo", "--timeout", "nan"], {}, ["--timeout nan"]),
    (["demo", "--steps", "0"], {}, ["--steps 0"]),
    (["demo", "--global-batch", "-1"], {}, ["--global-batch -1"]),
    (["demo", "--emulate", "foo:2"], {}, ["--emulate foo:2", "'foo'", "known chips"]),
    (["demo", "--emulate", "cuda:-1"], {}, ["--emulate cuda:-1", "count '-1'", "whole number"]),
    (["demo", "--emulate", "CUDA:2"], {}, ["CUDA:2", "lower case", "'cuda:2'"]),
    (["demo", "--emulate", "cuda:2,,ascend:2"], {}, ["cuda:2,,ascend:2", "item 2 is empty"]),
    (["demo", "--emulate", "cuda:2,ascend"], {}, ["cuda:2,ascend", "every item needs a count"]),
    (["demo", "--emulate", ""], {}, ["--emulate ''"]),
    (["demo", "--emulate", "cuda:100000000"], {}, ["cuda:100000000", "above 65536"]),
    (["demo", "--emulate", "cuda:300"], {}, ["ranks to start 300", "256"]),
    (["demo", "--nproc", "3", "--emulate", "cuda:2,ascend:2"], {}, ["--nproc 3", "4 ranks"]),
    (["demo", "--nproc", "1"], {}, ["--nproc 1", "at least 2"]),
    (["demo", "--nproc", "100000"], {}, ["--nproc 100000"]),
    (["demo"], {"HAL_EMULATE": "foo:2"}, ["HAL_EMULATE='foo:2'", "'foo'"]),
    (["demo"], {"HAL_CHIP": "foo"}, ["HAL_CHIP='foo'"]),
    (["demo"], {"HAL_PLUGINS": "nosuch"}, ["HAL_PLUGINS='nosuch'", "nosuch"]),
    (["demo"], {"HAL_CLUSTER": "/nonexistent/spec.toml"}, ["HAL_CLUSTER=/nonexistent/spec.toml"]),
    (["demo", "--nproc", "3"], {"HAL_CLUSTER": LAPTOP}, ["--nproc 3", "names 4 ranks"]),
    (["demo"], {"HAL_CLUSTER": str(ROOT / "examples" / "clusters" / "h800-910b-32.toml")},
     ["rank 0 of 32", "not natively available", "HAL_EMULATE=cuda"]),
    (["demo"], {"HAL_CPU_CCL": "bogus"}, ["HAL_CPU_CCL='bogus'"]),
    (["bench", "comm", "--min-bytes", "banana"], {}, ["--min-bytes banana"]),
    (["bench", "comm", "--min-bytes", "1M", "--max-bytes", "4K"], {}, ["--min-bytes (1048576)", "(4096)"]),
    (["bench", "comm", "--step-factor", "1"], {}, ["--step-factor", "1.0"]),
    (["bench", "comm", "--step-factor", "1.001"], {}, ["--step-factor 1.001", "at most 64"]),
    (["bench", "comm", "--emulate", "foo:2"], {}, ["--emulate foo:2", "'foo'"]),
    (["bench", "comm", "--nproc", "0"], {}, ["--nproc 0"]),
    (["bench", "comm", "--nproc", "1", "--emulate", "cuda:1"], {}, ["--nproc 1"]),
    (["bench", "comm", "--timeout", "-5"], {}, ["--timeout -5"]),
    (["bench", "comm", "--iters", "0"], {}, ["--iters 0"]),
    (["bench", "comm"], {"HAL_EMULATE": "cuda:2,,ascend:2"}, ["item 2 is empty"]),
    (["bench", "comm", "--json", "report.pdf"], {}, ["--json report.pdf", ".json"]),
    (["testbed", "up", "--chips", "foo:4"], {}, ["--chips foo:4", "'foo'"]),
    (["testbed", "up", "--chips", "cuda:2,,ascend:2"], {}, ["--chips cuda:2,,ascend:2", "item 2 is empty"]),
    (["testbed", "up", "--chips", "cuda:3,ascend:3"], {}, ["maps 6 ranks", "--ranks 2,2 has 4"]),
    (["testbed", "run", "--timeout", "0", "--", "-m", "x"], {}, ["--timeout 0"]),
    (["conformance", "--plugin", "nosuch"], {}, ["--plugin nosuch", "entry points"]),
    (["conformance", "--plugin", "cpu", "--level", "contract", "-k", "nosuchcheck"], {}, ["-k nosuchcheck"]),
    (["conformance", "--plugin", "cpu", "--nproc", "0"], {}, ["--nproc 0"]),
    (["conformance", "--plugin", "cpu", "--timeout", "-5"], {}, ["--timeout -5"]),
    (["conformance", "--plugin", "cpu", "--report", "r.pdf"], {}, ["--report r.pdf", ".md or .html"]),
]


@pytest.mark.parametrize("argv,env,needles", CASES, ids=[" ".join(c[0]) + " " + " ".join(
    f"{k}={v}" for k, v in c[1].items()) for c in CASES])
def test_bad_input_stops_before_launch(argv, env, needles, launches, monkeypatch, capsys):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    code = main(argv)
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, (code, out, err)
    assert len(lines) == 1, err
    assert "Traceback" not in err + out
    assert lines[0].startswith("hal ")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert launches == [], "a worker was started"


@pytest.mark.parametrize("body,line,needles", [
    ('ranks_per_node = 100000000\n', 5, ["ranks_per_node = 100000000", "1024"]),
    ('ranks_per_node = 2\nemulate = "yes"\n', 6, ["emulate = 'yes'", "boolean"]),
    ('ranks_per_node = 2\ncolocate = 1\n', 6, ["colocate = 1", "boolean"]),
])
def test_bad_cluster_spec_stops_demo(body, line, needles, tmp_path, launches, monkeypatch, capsys):
    monkeypatch.setenv("HAL_CLUSTER", _bad_spec(tmp_path, body))
    assert main(["demo"]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err and launches == []
    assert lines[0].startswith("hal demo: error: HAL_CLUSTER=") and f"spec.toml:{line}:" in lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_output_folder_is_created_up_front(tmp_path, launches, capsys):
    target = tmp_path / "new" / "dir" / "rows.json"
    assert main(["bench", "comm", "--max-bytes", "8K", "--json", str(target)]) == 0
    assert target.parent.is_dir()
    (cmd, _), = launches
    assert cmd[cmd.index("--json") + 1] == str(target.resolve())


def test_output_that_is_a_folder_is_refused(tmp_path, launches, capsys):
    folder = tmp_path / "x.json"
    folder.mkdir()
    assert main(["bench", "comm", "--json", str(folder)]) == 2
    assert "is a directory" in capsys.readouterr().err and launches == []


def test_world_size_comes_from_the_cluster_spec(launches, monkeypatch, capsys):
    # `HAL_CLUSTER=examples/clusters/laptop-2x2.toml hal demo` must not ask for --nproc
    monkeypatch.setenv("HAL_CLUSTER", LAPTOP)
    assert main(["demo", "--steps", "3"]) == 0
    (cmd, env), = launches
    assert cmd[cmd.index("--nproc-per-node") + 1] == "4" and env["HAL_CLUSTER"] == LAPTOP
    assert "HAL_EMULATE" not in env


def test_nproc_alone_splits_cuda_and_ascend(launches, capsys):
    assert main(["demo", "--nproc", "6"]) == 0
    (cmd, env), = launches
    assert cmd[cmd.index("--nproc-per-node") + 1] == "6" and env["HAL_EMULATE"] == "cuda:3,ascend:3"


def test_default_bench_is_small(launches, capsys):
    # the default ladder stops at 16 MiB (the old 256 MiB default took ~3 minutes on this machine)
    from hal.bench.harness import parse_size
    assert main(["bench", "comm"]) == 0
    (cmd, _), = launches
    assert parse_size(cmd[cmd.index("--max-bytes") + 1]) == 16 << 20


# ---- run time: the first failing rank, once ------------------------------------------------------
_FAKE_RANKS = r"""
import os, sys, time
from hal.launch.check import report_rank_failure
os.environ["HAL_EMULATE"] = "cuda:2,ascend:2"
for rank, exc in ((3, ValueError("shape (4, 8) vs (4, 9) in op 'matmul'")), (0, TimeoutError("peer gone"))):
    os.environ["RANK"] = str(rank)
    report_rank_failure(exc)
    print("Traceback (most recent call last):\n  ...noise...", file=sys.stderr)
    time.sleep(0.01)
sys.exit(1)
"""


def test_launcher_prints_the_first_failing_rank_once(capsys):
    from hal.launch.check import run_ranks
    import os
    code = run_ranks("hal demo", [sys.executable, "-c", _FAKE_RANKS], dict(os.environ))
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert code == 1 and len(lines) == 2, err
    assert lines[0] == ("hal demo: error: first failing rank: rank=3 chip=ascend ValueError: "
                        "shape (4, 8) vs (4, 9) in op 'matmul'")
    log = lines[1].split("full log of every rank: ")[1]
    text = Path(log).read_text()
    assert "Traceback" in text and "peer gone" in text and "Traceback" not in err
    os.unlink(log)


def test_launcher_without_a_python_error_says_so(capsys):
    from hal.launch.check import run_ranks
    import os
    code = run_ranks("hal bench comm", [sys.executable, "-c", "import sys; print('killed', file=sys.stderr); "
                                        "sys.exit(3)"], dict(os.environ))
    err = capsys.readouterr().err.splitlines()
    assert code == 3 and "exited with code 3" in err[0] and "killed" in err[0]
    os.unlink(err[1].split(": ")[-1])


# ---- flags do what their help says ----------------------------------------------------------------
def test_info_exits_2_when_no_accelerator_can_be_selected(monkeypatch, capsys):
    from hal.core.selection import reset
    monkeypatch.setenv("HAL_EMULATE", "foo")
    try:
        assert main(["info"]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and "'foo'" in err
        assert main(["info", "--json"]) == 2
    finally:
        reset()


def test_ops_check_takes_its_chips_from_hal_emulate(monkeypatch, capsys):
    monkeypatch.setenv("HAL_EMULATE", "ascend")
    assert main(["ops-check", "--ops", "silu", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "chip ascend (EMULATED" in out and "chip cuda" not in out and "chip cpu" not in out
    assert "1 chip(s)" in out


# ---- the small-batch parity case (`hal demo --steps 10 --global-batch 4`) --------------------------
def _ddp_replay(cfg, corpus, dtype, world: int, lose_rank: int = -1):
    """The demo's DDP arithmetic in one process: each rank's summed loss over its rows divided by the
    global token count, the gradients SUMMED over the ranks (what the trainer's DDP all_reduce does),
    then the same AdamW step on every replica. `lose_rank` >= 0 drops that rank's gradient from the sum:
    the kind of bug parity is there to catch."""
    import torch

    import hal.ops as ops
    from hal.cli.demo_job import flat
    from hal.strategies.models import IGNORE_INDEX, build_model, count_tokens, rank_slice
    from hal.trainer.data import train_batch
    from hal.trainer.trainer import build_optimizer
    mc = cfg.load_model_config()
    model = build_model(mc, cfg.seed).to(dtype)
    opt = build_optimizer(cfg, list(model.parameters()))
    for s in range(cfg.last_step):
        for group in opt.param_groups:
            group["lr"] = cfg.lr_at(s)
        x, y = train_batch(corpus, cfg.seed, s, cfg.global_batch, mc.seq)
        total = [torch.zeros_like(p) for p in model.parameters()]
        for r in range(world):
            model.zero_grad(set_to_none=True)
            logits = model(rank_slice(x, r, world))
            loss = ops.cross_entropy(logits.reshape(-1, logits.size(-1)), rank_slice(y, r, world).reshape(-1),
                                     IGNORE_INDEX, "sum") / count_tokens(y)
            loss.backward()
            if r == lose_rank:
                continue
            for t, p in zip(total, model.parameters()):
                t += p.grad
        for t, p in zip(total, model.parameters()):
            p.grad = t
        opt.step()
        opt.zero_grad(set_to_none=True)
    return flat(dict(model.named_parameters()))


def test_small_batch_parity_criterion(tmp_path):
    import torch
    from hal.cli.demo_job import demo_config, float32_floor, parity_ok, replay
    from hal.trainer.data import Corpus
    world, tol = 4, 1e-4   # hal demo --steps 10 --global-batch 4 (1 sequence per rank)
    cfg = demo_config(10, 4, tmp_path)
    corpus = Corpus.from_config(cfg)
    # 1. the code is right: in float64 the data split, the global token count and DDP's summed gradients
    #    give the single-process result to rounding
    ddp64 = _ddp_replay(cfg, corpus, torch.float64, world)
    exact, _ = replay(cfg, corpus, torch.float64)
    assert (ddp64 - exact).abs().max().item() < 1e-10
    # 2. float32: the distributed sum order against the single process, judged by the demo's criterion
    #    (within tol, or within max(tol, 2 x the single process's own float32 error) of exact)
    ddp32 = _ddp_replay(cfg, corpus, torch.float32, world)
    single32, _ = replay(cfg, corpus)
    floor = float32_floor(ddp32, single32, exact)
    assert parity_ok((ddp32 - single32).abs().max().item(), tol, floor), floor
    # 3. ... and it still catches a real bug: one rank's gradient lost from the all_reduce
    wrong = _ddp_replay(cfg, corpus, torch.float32, world, lose_rank=3)
    wrong_floor = float32_floor(wrong, single32, exact)
    assert not parity_ok((wrong - single32).abs().max().item(), tol, wrong_floor), wrong_floor
    print("float32 floor (ddp, single):", floor, "diff", (ddp32 - single32).abs().max().item())


def test_conformance_list_into_a_closed_pipe_is_quiet():
    # `hal conformance --list | head -1`: no BrokenPipeError traceback
    proc = subprocess.run(f"{sys.executable} -c '{HAL_MAIN}' conformance --plugin cpu --list | head -1",
                          shell=True, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.stdout.startswith("contract.") and "Traceback" not in proc.stderr, proc.stderr


def test_any_command_into_a_closed_pipe_is_quiet():
    # `hal cluster show BIG.toml | head -1`: hal.cli.main turns the reader leaving into exit 141, no traceback
    proc = subprocess.run(f"{sys.executable} -c '{HAL_MAIN}' cluster show examples/clusters/three-vendor-1024.toml "
                          f"| head -1", shell=True, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.stdout.startswith("cluster three-vendor-1024") and "Traceback" not in proc.stderr, proc.stderr
    assert "BrokenPipeError" not in proc.stderr, proc.stderr


def test_bench_native_without_a_map_defaults_to_4_ranks(launches, capsys):
    assert main(["bench", "comm", "--emulate", "none"]) == 0
    (cmd, env), = launches
    assert cmd[cmd.index("--nproc-per-node") + 1] == "4" and "HAL_EMULATE" not in env


def test_cluster_show_refuses_a_huge_layout_at_once(tmp_path, capsys):
    # `ranks_per_node = 100000000` used to lay out 1e8 ranks for minutes before printing anything
    assert main(["cluster", "show", _bad_spec(tmp_path, "ranks_per_node = 100000000\n")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "ranks_per_node = 100000000" in err and "1024" in err


def test_demo_plan_says_which_ranks_are_emulated(monkeypatch):
    import argparse
    from hal.cli.demo import add_arguments, plan
    p = argparse.ArgumentParser()
    add_arguments(p)
    for k in CLEAN:
        monkeypatch.delenv(k, raising=False)
    nproc, env, source, chips = plan(p.parse_args([]), {"HAL_CLUSTER": LAPTOP})
    assert nproc == 4 and chips == [("cuda", True), ("cuda", True), ("ascend", True), ("ascend", True)]
    assert source.startswith("HAL_CLUSTER=")
