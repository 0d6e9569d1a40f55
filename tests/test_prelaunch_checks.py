"""`hal train` refuses, before torchrun starts, what cannot run (issue 26 item 4 and the config half of 5):
`lr = inf`, `seed = true`, `global_batch = 1e9`, `seq = 1e8`, and a 70 B model on `plan even` (and the same
layout from a plan file, and `plan auto`) over emulated cuda:2 + ascend:2 chips - each exit 2 with one line
naming the field, or the ranks with the planner's memory figures (needed vs usable GiB). In process: the
launcher's subprocess calls are replaced by a tripwire, so a check that lets a config through fails the
test instead of starting ranks. Every chip EMULATED; nothing is trained.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hal.trainer.config import MAX_GLOBAL_BATCH, TrainConfig, TrainConfigError

ROOT = Path(__file__).resolve().parent.parent
BASE = {"steps": 10, "global_batch": 8, "backend": "gloo", "optimizer": {"warmup_steps": 2},
        "model": {"path": str(ROOT / "examples/models/tiny.toml"), "overrides": {"vocab": 256, "seq": 32}},
        "cluster": {"emulate": "cuda:2,ascend:2"}}


def _toml(tmp_path: Path, top: str = "", model: str = "tiny", overrides: str = "vocab = 256, seq = 32",
          optimizer: str = "", plan: str = 'source = "even"') -> Path:
    path = tmp_path / "train.toml"
    path.write_text(f"""{top}
steps = 10
global_batch = 8
backend = "gloo"
[model]
path = "{ROOT / 'examples/models' / (model + '.toml')}"
overrides = {{ {overrides} }}
[optimizer]
warmup_steps = 2
{optimizer}
[cluster]
emulate = "cuda:2,ascend:2"
[plan]
{plan}
[log]
dir = "{tmp_path / 'run'}"
""")
    return path


@pytest.fixture
def no_launch(monkeypatch):
    def tripwire(*args, **kwargs):
        raise AssertionError(f"a process was started: {args[0] if args else kwargs}")
    for name in ("call", "run", "Popen"):
        monkeypatch.setattr(subprocess, name, tripwire)


def _refused(path: Path, capsys) -> str:
    from hal.cli.train import main
    assert main(["--config", str(path)]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("hal train: error: "), err
    return err[0]


@pytest.mark.parametrize("field, value, words", [
    ("seed", True, "a boolean where a number is expected"),
    ("optimizer.lr", float("inf"), "finite number"),
    ("optimizer.lr", float("nan"), "finite number"),
    ("timeout_s", float("inf"), "finite number"),
    ("plan.zero", False, "a boolean where a number is expected"),
    ("global_batch", 10**9, f"less than or equal to {MAX_GLOBAL_BATCH}"),
    ("debug.throttle", {"1": True}, "a boolean where a number is expected"),
])
def test_config_bounds(field, value, words):
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in BASE.items()}
    section, _, name = field.rpartition(".")
    (data.setdefault(section, {}) if section else data)[name or field] = value
    with pytest.raises(TrainConfigError) as info:
        TrainConfig(**data)
    assert info.value.field.startswith(field) and words in str(info.value), str(info.value)


@pytest.mark.parametrize("case", ["lr = inf", "seed = true", "global_batch = 1e9"])
def test_hal_train_refuses_bad_numbers(tmp_path, capsys, no_launch, case):
    if case.startswith("lr"):
        path = _toml(tmp_path, optimizer="lr = inf")
    elif case.startswith("seed"):
        path = _toml(tmp_path, top="seed = true")
    else:
        path = tmp_path / "gb.toml"
        path.write_text(_toml(tmp_path).read_text().replace("global_batch = 8", "global_batch = 1e9"))
    line = _refused(path, capsys)
    assert case.split(" =")[0] in line, line


def test_70b_on_plan_even_is_refused_with_the_figures(tmp_path, capsys, no_launch):
    line = _refused(_toml(tmp_path, model="llama-70b", overrides="vocab = 256"), capsys)
    assert "does not fit memory" in line and "llama-70b" in line, line
    for rank, chip in enumerate(["cuda", "cuda", "ascend", "ascend"]):
        assert f"rank {rank} ({chip} " in line, line
    assert line.count("GiB, usable") == 4, line


def test_70b_from_a_plan_file_is_refused_too(tmp_path, capsys, no_launch):
    from hal.core.topology import Topology
    from hal.strategies.models import ModelConfig
    from hal.strategies.plan import Plan
    model = ModelConfig(**{**ModelConfig.from_toml(ROOT / "examples/models/llama-70b.toml").model_dump(), "vocab": 256})
    topo = Topology.from_env({"HAL_EMULATE": "cuda:2,ascend:2"}, world_size=4)
    (tmp_path / "plan.json").write_text(Plan.even(topo, model, 8, 1).to_json())
    line = _refused(_toml(tmp_path, model="llama-70b", overrides="vocab = 256",
                          plan=f'source = "file"\nfile = "{tmp_path / "plan.json"}"'), capsys)
    assert "plan file for model 'llama-70b' does not fit memory" in line and "rank 3 (ascend" in line, line


def test_seq_1e8_is_refused_by_the_memory_check(tmp_path, capsys, no_launch):
    line = _refused(_toml(tmp_path, overrides="vocab = 256, seq = 100000000"), capsys)
    assert "does not fit memory" in line and "rank 0 (cuda" in line, line


def test_70b_on_plan_auto_is_refused_before_launch(tmp_path, capsys, no_launch):
    line = _refused(_toml(tmp_path, model="llama-70b", overrides="vocab = 256", plan='source = "auto"'), capsys)
    assert "fits" in line and "llama-70b" in line, line
