"""Checkpoints that cannot lie (hal/trainer/integrity.py, hal/trainer/checkpoint.py): every file's sha256 in
`manifest.json`, checked before a resume loads anything; a corrupt newest checkpoint is named in one warning
and the run falls back to the newest good one; `hal train --check-checkpoints DIR`; a model-size mismatch is
one CheckpointError naming the entries.

In process (no ranks): a DCP checkpoint written by one process, then flipped bytes, a truncated shard, an
emptied `.metadata`, a deleted shard, a manifest-less (older) checkpoint, and the command's listing and exit
codes. Multi-process (2 ranks, cuda:1 + ascend:1, every chip EMULATED on this CPU, DP 2 over gloo): one
uninterrupted reference run of 3 steps checkpointing every step (steps 1 and 2 async, 3 final); its
steps 1 and 2 copied to a new run folder are the run stopped at step 2, whose newest checkpoint (step 2)
is corrupted in turn (a pristine copy each time) with a flipped byte in a shard and an emptied `.metadata`
(a shard's sha256 and the DCP metadata's length; that verify names the truncated and the deleted shard too
is its in-process case, and a resume acts on verify's verdict whatever the kind): each resume must skip it,
with its path in `skipped`, start at step 1 and end with the reference's exact final loss, validation loss
and parameter digest; last, a resume with another hidden size is one CheckpointError naming the entries.

The non-finite guard (hal/trainer/nonfinite.py) rides on these warm ranks rather than on `hal train`
launches of its own (a launch costs a whole torchrun start-up): every run here has `on_nonfinite = "skip"`
and a NaN put into rank 1's gradient at step 3 (the test-only `[debug]` fault `nan_grad`), so step 3's
optimizer step is skipped on every rank, metrics.jsonl and summary.json count it, and no checkpoint holds a
NaN (each resume skips it again, so the final figures still agree exactly); and one run with the default
`stop` ends on every rank with the NonFiniteError naming step, rank and parameter, with no checkpoint of
that step or later and none holding a NaN.
"""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from hal.testing import WorkerPool
from hal.testing.worker_pool import WorkerError
from hal.trainer import integrity

from . import _integrity_cases as cases

ROOT = Path(__file__).resolve().parent.parent


# ---- in process ----------------------------------------------------------------------------------
def _dcp_step(path: Path, manifest: bool = True) -> Path:
    import torch.distributed.checkpoint as dcp
    dcp.save({"w": torch.arange(4096, dtype=torch.float32), "b": torch.ones(3)}, checkpoint_id=str(path))
    if manifest:
        integrity.write_manifest(path)
    (path / integrity.MARK).write_text("1\n")
    return path


def _shard(path: Path) -> Path:
    return next(path.glob("*.distcp"))


def _flip(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


CORRUPTIONS = {
    "flipped bytes": lambda step: _flip(_shard(step)),
    "truncated shard": lambda step: _truncate(_shard(step)),
    "emptied .metadata": lambda step: (step / ".metadata").write_bytes(b""),
    "deleted shard": lambda step: _shard(step).unlink(),
}


pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_verify_names_the_file_and_why(tmp_path, kind):
    step = _dcp_step(tmp_path / "step_00000001")
    assert integrity.verify(step) is None
    name = ".metadata" if "metadata" in kind else _shard(step).name
    CORRUPTIONS[kind](step)
    problem = integrity.verify(step)
    assert problem is not None and problem.file == name, problem
    want = {"flipped bytes": "sha256", "truncated shard": "bytes", "emptied .metadata": "bytes",
            "deleted shard": "missing"}[kind]
    assert want in problem.reason, problem


def test_verify_shares_split_the_files(tmp_path):
    step = _dcp_step(tmp_path / "step_00000001")
    _flip(step / ".metadata")
    files = sorted(integrity.read_manifest(step)[0])
    i = files.index(".metadata")
    assert integrity.verify(step, (i % 2, 2)) is not None and integrity.verify(step, ((i + 1) % 2, 2)) is None


def test_checkpoint_without_manifest_gets_a_structure_check(tmp_path):
    step = _dcp_step(tmp_path / "step_00000001", manifest=False)
    assert integrity.state_of(step)[0] == "ok" and "no manifest" in integrity.state_of(step)[1]
    _truncate(_shard(step))
    assert integrity.state_of(step)[0] == "corrupt" and "truncated" in integrity.state_of(step)[1]
    (step / ".metadata").write_bytes(b"")
    assert integrity.verify(step).file == ".metadata"


def test_check_checkpoints_lists_each_step_and_exits_0_1_2(tmp_path, capsys):
    from hal.cli.train import main
    run = tmp_path / "run"
    _dcp_step(run / "checkpoints" / "step_00000002")
    newest = _dcp_step(run / "checkpoints" / "step_00000004")
    (run / "checkpoints" / "step_00000006").mkdir()  # a save that never finished
    assert main(["--check-checkpoints", str(run)]) == 0  # a run folder: its checkpoints/
    out = capsys.readouterr().out
    assert "incomplete" in out and out.count(" ok ") == 2 and "is good" in out, out
    _flip(_shard(newest))
    assert main(["--check-checkpoints", str(run / "checkpoints")]) == 1
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if "step_00000004" in ln]
    assert len(lines) == 1 and "corrupt" in lines[0] and _shard(newest).name in lines[0], out
    assert main(["--check-checkpoints", str(tmp_path / "nowhere")]) == 2
    assert main(["--check-checkpoints", str(tmp_path)]) == 2
    assert "no step_<N>" in capsys.readouterr().err


# ---- multi-process: the four corruptions end to end ----------------------------------------------
STEPS = 3


def _config(run_dir: Path, **extra) -> dict:
    cfg = {"seed": 5, "steps": STEPS, "global_batch": 4, "backend": "gloo", "timeout_s": 60,
           "model": {"path": str(ROOT / "examples/models/tiny.toml"), "overrides": {"vocab": 256, "seq": 16}},
           "data": {"max_bytes": 1 << 18},
           "optimizer": {"lr": 3e-3, "warmup_steps": 1},
           "plan": {"source": "even"},
           "checkpoint": {"interval": 1},
           "log": {"dir": str(run_dir), "val_interval": 0, "val_batches": 1, "plots": False},
           "train": {"on_nonfinite": "skip", "max_skipped": 1},
           "debug": {"faults": [{"action": "nan_grad", "rank": 1, "step": 3}]}}
    cfg.update(extra)
    return cfg


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(2, env={"HAL_EMULATE": "cuda:1,ascend:1", "OMP_NUM_THREADS": "1", "HAL_CPU_CCL": "gloo"}) as p:
        yield p


@pytest.fixture(scope="module")
def runs(pool, tmp_path_factory):
    d = tmp_path_factory.mktemp("integrity")
    reference = pool.run(cases.run_with_warnings, _config(d / "reference"), timeout=240)
    for step in (1, 2):  # the run as if stopped after step 2
        shutil.copytree(d / "reference" / "checkpoints" / f"step_{step:08d}", d / "stopped" / f"step_{step:08d}")
    return d / "stopped", reference


def test_nan_gradient_skipped_on_every_rank_counted_and_never_saved(runs):
    from .test_nonfinite import checkpoints_finite
    run = runs[0].parent / "reference"
    records = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("nonfinite_skipped", 0) for r in records] == [0, 0, 1], records
    summary = json.loads((run / "summary.json").read_text())
    assert summary["nonfinite_skipped"] == 1 and math.isfinite(summary["final_val_loss"]), summary
    assert checkpoints_finite(run) == [1, 2, 3]


def test_corrupt_newest_checkpoint_falls_back_and_ends_exact(pool, runs, tmp_path):
    pristine, reference = runs
    for kind in ("flipped bytes", "emptied .metadata"):  # each kind's verdict: test_verify_names_the_file_and_why
        corrupt = CORRUPTIONS[kind]
        run = tmp_path / kind.replace(" ", "_").replace(".", "")
        shutil.copytree(pristine, run / "checkpoints")
        bad = run / "checkpoints" / "step_00000002"
        corrupt(bad)
        results = pool.run(cases.run_with_warnings, _config(run), timeout=240)
        warned = [w for w in results[0]["warnings"] if "is not trusted" in w]  # rank 0's console line
        assert len(warned) == 1 and str(bad) in warned[0] and "falling back" in warned[0], (kind, results[0])
        for got, ref in zip(results, reference):
            assert got["start"] == 1, (kind, got["start"])
            skipped = got["resumed"]["skipped"]
            assert len(skipped) == 1 and str(bad) in skipped[0], (kind, skipped)
            assert got["losses"][-1] == ref["losses"][-1] and got["digest"] == ref["digest"], kind
            assert got["final_val_loss"] == ref["final_val_loss"], kind


def test_another_model_size_is_one_checkpoint_error_naming_entries(pool, runs, tmp_path):
    pristine, _ = runs
    shutil.copytree(pristine, tmp_path / "wide" / "checkpoints")
    cfg = _config(tmp_path / "wide")
    cfg["model"]["overrides"]["hidden"] = 96
    with pytest.raises(WorkerError) as info:
        pool.run(cases.run_with_warnings, cfg, timeout=240)
    for o in info.value.outcomes:
        assert o.error_type == "CheckpointError", o.error
        assert "step_00000002" in o.error and "another shape" in o.error and "in the checkpoint" in o.error, o.error


def test_nan_gradient_stops_every_rank_naming_step_rank_parameter(pool, tmp_path):
    from .test_nonfinite import checkpoints_finite
    cfg = _config(tmp_path / "stop", train={}, debug={"faults": [{"action": "nan_grad", "rank": 1, "step": 2}]})
    with pytest.raises(WorkerError) as info:
        pool.run(cases.run_with_warnings, cfg, timeout=240)
    for o in info.value.outcomes:
        assert o.error_type == "NonFiniteError", o.error
        assert ("step 2: non-finite gradient on rank 1: first non-finite parameter embed.weight" in o.error
                and "no checkpoint written" in o.error), o.error
    assert checkpoints_finite(tmp_path / "stop") in ([], [1])  # step 1's async save may still be in flight
