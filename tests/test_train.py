"""`hal train` (hal/trainer/): config errors name the field and value; the byte corpus is a pure function
of (seed, step) and the plan's rows cover each global batch once; on an emulated 2 cuda + 2 ascend
cluster (every chip EMULATED on CPU, training collectives over the `hetero` bridge) a short run of
the tiny GPT (PP 2 x DP 2) on the Python standard library lowers validation loss well below uniform bytes
(ln 256 = 5.55 nats) and writes metrics.jsonl and TensorBoard events that agree.

Proven once elsewhere on warm ranks rather than repeated here (each run is a whole run on 4 ranks):
the bitwise repeat and resume of this same GPT PP 2 x DP 2 run on 2+2, and the loader position saved with
a checkpoint, are tests/test_trainer_resume.py; the MoE with EP lowering loss, repeating bitwise and each
EP rank holding other experts is tests/test_trainer_metrics.py (on 2+1+1)."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hal.trainer.config import TrainConfig, TrainConfigError
from hal.trainer.data import Corpus, replica_rows, stdlib_dir, train_batch

from . import _train_cases

ROOT = Path(__file__).resolve().parent.parent
EMULATE = "cuda:2,ascend:2"
STEPS = 12  # lr 1e-2: validation loss ~3.7 by step 12 (single-process replay: 3.69; bar 4.55)


def _config(run_dir: Path, **extra) -> dict:
    cfg = {"seed": 3, "steps": STEPS, "global_batch": 8, "backend": "hetero", "timeout_s": 60,
           "model": {"path": str(ROOT / "examples/models/tiny.toml"), "overrides": {"vocab": 256, "seq": 32}},
           "data": {"max_bytes": 1 << 20},
           "optimizer": {"lr": 1e-2, "warmup_steps": 2},
           # 2 pipeline stages (cuda ranks 0,1 | ascend ranks 2,3) x 2 DP replicas, 2 micro-batches
           "plan": {"source": "even", "pp": 2, "num_microbatches": 2},
           "checkpoint": {"enabled": False},  # checkpoints and resume: tests/test_trainer_resume.py
           "log": {"dir": str(run_dir), "val_interval": 6, "val_batches": 2, "plots": False}}  # PNGs: test_trainer_metrics
    cfg.update(extra)
    return cfg


def test_config_errors_name_field_and_value(tmp_path):
    with pytest.raises(TrainConfigError, match=r"optimizer\.lr = -1"):
        TrainConfig(**_config(tmp_path, optimizer={"lr": -1}))
    with pytest.raises(TrainConfigError, match=r"plan\.file = None"):
        TrainConfig(**_config(tmp_path, plan={"source": "file"}))
    with pytest.raises(TrainConfigError, match=rf"stop_after = 50: exceeds steps = {STEPS}"):
        TrainConfig(**_config(tmp_path, stop_after=50))
    with pytest.raises(TrainConfigError, match=r"model\.overrides\.hidden = 30"):
        TrainConfig(**_config(tmp_path, model={"path": str(ROOT / "examples/models/tiny.toml"),
                                               "overrides": {"hidden": 30}})).load_model_config()
    with pytest.raises(TrainConfigError, match=r"bogus = 1: unknown field"):
        TrainConfig(**_config(tmp_path, bogus=1))
    example = TrainConfig.from_toml(ROOT / "examples/train/tiny.toml")
    assert example.load_model_config().vocab == 256


def test_lr_schedule_warmup_then_cosine(tmp_path):
    cfg = TrainConfig(**_config(tmp_path, steps=40, optimizer={"lr": 3e-3, "warmup_steps": 5}))
    lrs = [cfg.lr_at(s) for s in range(40)]
    assert lrs[0] == pytest.approx(3e-3 / 5) and lrs[4] == pytest.approx(3e-3)
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:]))  # non-increasing after warmup
    assert lrs[-1] >= 3e-4 and lrs[-1] < 3e-3 * 0.2


def test_corpus_is_a_pure_function_of_seed_and_step(tmp_path):
    corpus = Corpus.from_config(TrainConfig(**_config(tmp_path)))
    assert corpus.train.numel() > 0 and corpus.val.numel() > 0
    a, b = train_batch(corpus, 3, 7, 8, 32), train_batch(corpus, 3, 7, 8, 32)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert a[0].shape == (8, 32) and a[0].max() < 256
    assert torch.equal(a[0][:, 1:], a[1][:, :-1])  # targets are the inputs shifted by one byte
    assert not torch.equal(a[0], train_batch(corpus, 3, 8, 8, 32)[0])
    # a user's text files plug in the same way
    for i in range(6):
        (tmp_path / f"f{i}.txt").write_text(f"file {i} " * 400)
    user = Corpus.from_config(TrainConfig(**_config(tmp_path, data={"source": "files", "paths": [str(tmp_path)],
                                                                    "glob": "*.txt", "val_fraction": 0.4})))
    assert user.files == 6 and b"file" in bytes(user.train[:10].tolist())
    assert stdlib_dir().is_dir()


def test_plan_rows_cover_each_global_batch_once():
    from hal.core.topology import Topology
    from hal.strategies.models import ModelConfig
    from hal.strategies.plan import Plan
    topo = Topology.from_env({"HAL_EMULATE": "cuda:3,ascend:1"})
    cfg = ModelConfig(name="t", layers=2, hidden=32, heads=4, ffn=64, vocab=256, seq=32)
    plan = Plan.weighted(topo, cfg, 16, {"cuda": 3.0, "ascend": 1.0}, num_microbatches=2)
    covered = sorted(r for rank in plan.ranks for lo, hi in replica_rows(plan, rank) for r in range(lo, hi))
    assert covered == list(range(16))
    widths = {rank: replica_rows(plan, rank)[0][1] - replica_rows(plan, rank)[0][0] for rank in plan.ranks}
    assert widths[0] > widths[3]  # a faster chip's replica reads more rows


@pytest.mark.parametrize("missing", ["rich", "matplotlib"])
def test_train_without_the_train_extra_says_so_in_one_line(missing, monkeypatch, capsys, tmp_path):
    from hal.cli import main
    monkeypatch.setitem(sys.modules, missing, None)  # importing it fails, as when it is not installed
    code = main(["train", "--config", str(ROOT / "examples/train/tiny.toml"), "--run-dir", str(tmp_path / "r")])
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in out + err, err
    assert lines[0].startswith("hal train: error: ") and missing in lines[0]
    assert "pip install 'hetero-hal[train]'" in lines[0]
    assert not (tmp_path / "r").exists()  # nothing started


def test_trainer_modules_import_without_the_train_extra():
    # rich and matplotlib are imported where they are used (the progress bar, the plots), not at import
    code = ("import sys; sys.modules['rich'] = sys.modules['matplotlib'] = None; "
            "import hal.trainer.loop, hal.trainer.metrics, hal.trainer.plots, hal.trainer.report; "
            "from hal.trainer.metrics import Display; Display(10, 0, 5).close()")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


@pytest.fixture(scope="module")
def pool(shared_pools):
    return shared_pools.get(4, {"HAL_EMULATE": "cuda:2,ascend:2", "OMP_NUM_THREADS": "1"})  # one pool for test_train, test_trainer_resume, test_precision, test_meta_build (tests/conftest.py)


def _run(pool, config: dict) -> list[dict]:
    return pool.run(_train_cases.run, config, timeout=240)


def test_train_lowers_loss_and_writes_metrics_and_tensorboard(pool, tmp_path):
    log_a = {"dir": str(tmp_path / "a"), "val_interval": 6, "val_batches": 2, "tensorboard": True, "plots": False}
    a = _run(pool, _config(tmp_path / "a", log=log_a))  # run a also writes TensorBoard event files
    assert [r["chip"] for r in a] == ["cuda", "cuda", "ascend", "ascend"]
    val = a[0]["final_val_loss"]
    assert val < math.log(256) - 1.0, f"validation loss {val:.3f} not well below ln 256 = {math.log(256):.3f}"
    assert all(r["final_val_loss"] == val for r in a)
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["final_val_loss"] == val and [c["chip"] for c in summary["chips"]] == ["cuda", "cuda", "ascend", "ascend"]
    lines = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(1, STEPS + 1)) and len(lines[0]["rank_step_s"]) == 4
    assert [x["loss"] for x in lines] == a[0]["losses"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(tmp_path / "a" / "tensorboard"))  # the same scalars, read back
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(x["step"], pytest.approx(x["loss"]))
                                                                         for x in lines]
    assert [e.step for e in events.Scalars("val/loss")] == [6, STEPS] and "rank_step_s/r3_ascend" in \
        events.Tags()["scalars"]
