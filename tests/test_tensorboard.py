"""TensorBoard and other metric sinks of `hal train` (hal/trainer/sinks.py), in-process: metrics.jsonl-shaped
records fed to the sinks `[log] tensorboard = true` opens come back from the event files under
<run dir>/tensorboard through tensorboard's own EventAccumulator (loss, val loss, lr, grad norm, tokens/s per
chip kind, each rank's step time split); a `[log] sinks` factory is called with the run dir and chips, and a
failing sink is dropped while the others go on; without the tensorboard package `hal train` stops before
launch with one line naming the extra."""
from __future__ import annotations

import logging
import math
import sys
from pathlib import Path

import pytest

from hal.trainer.config import TrainConfig, TrainConfigError
from hal.trainer.sinks import MetricSink, Sinks, TensorBoardSink, open_sinks, scalars_of

ROOT = Path(__file__).resolve().parent.parent
CHIPS = ["cuda", "cuda", "ascend"]
WRITTEN: list = []  # what ListSink instances received (the factory below is named in configs by module path)


class ListSink:
    def __init__(self, run_dir, chips) -> None:
        self.run_dir, self.chips, self.closed = run_dir, chips, False

    def write(self, step, scalars) -> None:
        WRITTEN.append((step, dict(scalars)))

    def close(self) -> None:
        self.closed = True


def make_list_sink(run_dir, chips) -> ListSink:
    return ListSink(run_dir, chips)


class Broken:
    def write(self, step, scalars) -> None:
        raise OSError("disk full")

    def close(self) -> None:
        pass


def _record(step: int) -> dict:
    """A metrics.jsonl record as hal.trainer.metrics.RunMetrics.end writes it (3 ranks, no pipeline)."""
    rec = {"step": step, "loss": 5.0 - 0.1 * step, "lr": 1e-3 * step, "grad_norm": 1.5, "tokens_per_s": 100.0 * step,
           "step_s": 0.25, "tokens_per_s_chip": {"cuda": 80.0 * step, "ascend": 20.0 * step},
           "mfu_chip": {"cuda": 0.01, "ascend": None}, "rank_step_s": [0.2, 0.21, 0.25],
           "rank_compute_s": [0.1, 0.1, 0.2], "rank_wait_s": [0.1, 0.11, 0.05], "rank_comm_s": [0.09, 0.1, 0.04],
           "rank_bubble_s": [None, None, None], "rank_other_s": [0.01, 0.01, 0.01], "rank_device_s": [0.1] * 3,
           "bubble_est": 0.0, "time": 1.0}
    if step == 2:
        rec["val_loss"] = 4.5
    return rec


def _cfg(tmp: Path, **log) -> TrainConfig:
    return TrainConfig(seed=0, steps=4, global_batch=4, optimizer={"warmup_steps": 1},
                       model={"path": str(ROOT / "examples/models/tiny.toml")}, log={"dir": str(tmp), **log})


def test_scalars_of_a_record():
    s = scalars_of(_record(2), CHIPS)
    assert s["train/loss"] == pytest.approx(4.8) and s["val/loss"] == 4.5 and s["train/lr"] == pytest.approx(2e-3)
    assert s["tokens_per_s/cuda"] == 160.0 and s["tokens_per_s/ascend"] == 40.0 and "mfu/ascend" not in s
    assert s["rank_step_s/r2_ascend"] == 0.25 and s["rank_comm_s/r0_cuda"] == 0.09
    assert not any(k.startswith("rank_bubble_s") for k in s)  # not measured (None): left out
    assert "val/loss" not in scalars_of(_record(1), CHIPS) and scalars_of({"loss": math.nan}, CHIPS) == {}


def test_tensorboard_event_files_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    cfg = _cfg(tmp_path, tensorboard=True)
    opened = open_sinks(cfg, CHIPS)
    assert [type(s) for s in opened] == [TensorBoardSink] and isinstance(opened[0], MetricSink)
    sinks = Sinks(opened, CHIPS)
    for step in (1, 2, 3):
        sinks.write(step, _record(step))
    sinks.write(3, {"val_loss": 4.25})  # the final validation loss (RunMetrics.write_sinks)
    sinks.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/grad_norm", "val/loss", "throughput/tokens_per_s",
            "tokens_per_s/cuda", "tokens_per_s/ascend", "rank_step_s/r0_cuda", "rank_step_s/r2_ascend",
            "rank_compute_s/r1_cuda", "rank_comm_s/r2_ascend", "rank_other_s/r0_cuda"} <= tags
    loss = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    assert [s for s, _ in loss] == [1, 2, 3] and [v for _, v in loss] == pytest.approx([4.9, 4.8, 4.7])
    assert [(e.step, e.value) for e in acc.Scalars("val/loss")] == [(2, 4.5), (3, 4.25)]
    assert [e.value for e in acc.Scalars("tokens_per_s/ascend")] == [20.0, 40.0, 60.0]


def test_sinks_from_config_and_a_failing_sink_is_dropped(tmp_path, caplog):
    WRITTEN.clear()
    cfg = _cfg(tmp_path, sinks=["tests.test_tensorboard:make_list_sink"])
    (mine,) = open_sinks(cfg, CHIPS)
    assert isinstance(mine, ListSink) and mine.run_dir == tmp_path and mine.chips == CHIPS
    sinks = Sinks([Broken(), mine], CHIPS)
    with caplog.at_level(logging.WARNING, logger="hal.trainer"):
        sinks.write(1, _record(1))
        sinks.write(2, _record(2))
    assert [s for s, _ in WRITTEN] == [1, 2] and WRITTEN[1][1]["val/loss"] == 4.5
    assert "metric sink Broken failed at step 1 (OSError: disk full); dropped" in caplog.text
    sinks.close()
    assert mine.closed
    with pytest.raises(TrainConfigError, match=r"log\.sinks = 'tests\.test_tensorboard:nope': cannot load it"):
        _cfg(tmp_path, sinks=["tests.test_tensorboard:nope"])
    with pytest.raises(TrainConfigError, match=r"log\.sinks = 'no_colon': expected 'module:factory'"):
        _cfg(tmp_path, sinks=["no_colon"])


def test_without_tensorboard_hal_train_stops_before_launch_in_one_line(tmp_path, monkeypatch, capsys):
    from hal.cli import main
    config = tmp_path / "train.toml"
    config.write_text(f'steps = 4\nglobal_batch = 4\n[model]\npath = "{ROOT / "examples/models/tiny.toml"}"\n'
                      f'[optimizer]\nwarmup_steps = 1\n[cluster]\nemulate = "cuda:1"\n'
                      f'[log]\ndir = "{tmp_path / "run"}"\ntensorboard = true\n')
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # importing it fails, as when it is not installed
    code = main(["train", "--config", str(config)])
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in out + err, err
    assert "log.tensorboard = True" in lines[0] and "pip install 'hetero-hal[tensorboard]'" in lines[0]
    assert not (tmp_path / "run").exists()  # nothing started
