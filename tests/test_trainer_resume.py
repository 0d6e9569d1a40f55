"""`hal train` checkpoints (hal/trainer/checkpoint.py, DCP) resume and reshard, on emulated chips (every chip
EMULATED on this CPU; training collectives over the `hetero` bridge).

- Same plan (PP 2 x DP 2 on cuda:2 + ascend:2): a second run repeats the uninterrupted one bitwise (its
  losses up to step 6), stops at step 6 with the loader position in its checkpoint (data.json) and resumes
  = the uninterrupted run at step 12, bitwise (losses and a SHA-256 of every parameter); resuming from an
  asynchronously written checkpoint (dcp.async_save, step 8) is bitwise too. (The GPT's bitwise repeat is
  proven here only; tests/test_train.py and tests/test_trainer_metrics.py do not repeat it.)
- Resharding is exact: step 8's checkpoint, written by PP 2 x DP 2, loaded into DP 4, FSDP2 (zero 3) DP 4,
  TP 2 x PP 2, an interleaved schedule with two stages per rank, and a 3-rank cuda:2 + ascend:1 cluster
  on the planner's layout: every parameter and every AdamW moment a rank then holds equals, bitwise, the
  checkpoint's full tensor (read offline with DCP's dcp_to_torch_save), and together they cover the model.
- Training continues on another plan or cluster: a run stopped at step 6 on the interleaved plan (two
  stages per rank) resumes on FSDP2 DP 4, and step 8 of the 2+2 run resumes on the 3-rank cluster; both
  reach step 12 within TOL of the uninterrupted 2+2 run. Not bitwise, and not expected to be: a different
  plan sums the same gradients in another order (DP all_reduce over other groups, other micro-batch and
  row cuts), so float32 rounding differs from the first step after the resume on (about 1e-7 relative)
  and Adam's normalised updates carry it on; TOL bounds 4 steps of that drift (measured: see the asserts'
  messages), and is far below one step's update (lr 3e-3).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from hal.testing import WorkerPool

from . import _resume_cases as cases

ROOT = Path(__file__).resolve().parent.parent
STEPS, STOP, ASYNC_STEP = 12, 6, 8
TOL = 1e-6  # max |difference| of any parameter after 4-6 steps on another plan (measured 7.5e-9; docstring)
PP2_DP2 = {"source": "even", "pp": 2, "num_microbatches": 2}


def _config(run_dir: Path, plan=None, **extra) -> dict:
    cfg = {"seed": 3, "steps": STEPS, "global_batch": 8, "backend": "hetero", "timeout_s": 60,
           "model": {"path": str(ROOT / "examples/models/tiny.toml"), "overrides": {"vocab": 256, "seq": 32}},
           "data": {"max_bytes": 1 << 20},
           "optimizer": {"lr": 3e-3, "warmup_steps": 2},
           "plan": plan or PP2_DP2,
           "checkpoint": {"interval": 4},
           "log": {"dir": str(run_dir), "val_interval": 0, "val_batches": 1, "plots": False}}
    cfg.update(extra)
    return cfg


def _interleaved(tmp_path: Path) -> dict:
    """A plan file: 4 one-layer stages on Interleaved1F1B, stage i on the cuda pair (i even) or the ascend
    pair (i odd), so every rank holds two stages."""
    stages = [{"layers": [i, i + 1], "replicas": [{"ranks": [a], "microbatch": 2}, {"ranks": [b], "microbatch": 2}]}
              for i, (a, b) in enumerate([(0, 1), (2, 3), (0, 1), (2, 3)])]
    path = tmp_path / "interleaved.json"
    path.write_text(json.dumps({"version": 1, "model": "tiny", "num_microbatches": 2, "schedule": "Interleaved1F1B",
                                "zero": 0, "stages": stages}))
    return {"source": "file", "file": str(path)}


def _offline(step_dir: Path, tmp: Path) -> dict:
    """The checkpoint's full tensors, read without a process group (DCP's own converter)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    out = tmp / f"{step_dir.parent.parent.name}-{step_dir.name}.pt"
    dcp_to_torch_save(str(step_dir), str(out))
    return torch.load(out, weights_only=False)


def _model(sd: dict) -> dict:
    return {k: v for k, v in sd.items() if k.startswith("model.")}


def _copy_ckpt(src_run: Path, step: int, dst_run: Path) -> None:
    name = f"step_{step:08d}"
    shutil.copytree(src_run / "checkpoints" / name, dst_run / "checkpoints" / name)


def _check_loaded(results: list[dict], reference: dict) -> None:
    """Every tensor a rank holds after the load equals the checkpoint's; together they cover the model."""
    held = set()
    for r in results:
        assert r["resharded"] and r["step"] == ASYNC_STEP
        for k, v in r["state"].items():
            ref = reference[k]
            assert v.shape == ref.shape and torch.equal(v, ref.to(v.dtype)), f"rank {r['rank']}: {k} differs"
            held.add(k)
    missing = sorted(set(_model(reference)) - held)
    assert not missing, f"no rank holds {missing[:4]}"
    assert any(k.startswith("optim.state.") and k.endswith("exp_avg_sq") for k in held)


def _max_diff(a: dict, b: dict) -> float:
    assert set(_model(a)) == set(_model(b))
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in _model(a))


@pytest.fixture(scope="module")
def pool(shared_pools):
    return shared_pools.get(4, {"HAL_EMULATE": "cuda:2,ascend:2", "OMP_NUM_THREADS": "1"})  # one pool for test_train, test_trainer_resume, test_precision, test_meta_build (tests/conftest.py)


@pytest.fixture(scope="module")
def uninterrupted(pool, tmp_path_factory):
    d = tmp_path_factory.mktemp("resume") / "a"
    return d, pool.run(cases.run, _config(d), timeout=240)


def test_same_plan_resume_is_bitwise_also_from_an_async_checkpoint(pool, uninterrupted, tmp_path):
    a_dir, a = uninterrupted
    saved = sorted(p.name for p in (a_dir / "checkpoints").iterdir() if (p / ".complete").is_file())
    assert saved == ["step_00000004", "step_00000008", "step_00000012"]
    summary = json.loads((a_dir / "summary.json").read_text())
    assert [c["async"] for c in summary["checkpoints"]] == [True, True, False]

    c1 = pool.run(cases.run, _config(tmp_path / "c", stop_after=STOP), timeout=240)
    assert c1[0]["end"] == STOP and c1[0]["digest"] != a[0]["digest"]
    assert [r["losses"] for r in c1] == [r["losses"][:STOP] for r in a]  # the same seed and plan: bit-identical
    position = json.loads((tmp_path / "c" / "checkpoints" / f"step_{STOP:08d}" / "data.json").read_text())
    assert position["sequences"] == STOP * 8 and position["tokenizer"] == "bytes"  # the loader's, with the checkpoint
    c2 = pool.run(cases.run, _config(tmp_path / "c"), timeout=240)
    assert [r["start"] for r in c2] == [STOP] * 4 and not c2[0]["resumed"]["resharded"]
    assert [r["losses"] for r in c2] == [r["losses"][STOP:] for r in a]
    assert [r["digest"] for r in c2] == [r["digest"] for r in a]

    _copy_ckpt(a_dir, ASYNC_STEP, tmp_path / "e")  # written by dcp.async_save while step 9 trained
    e = pool.run(cases.run, _config(tmp_path / "e"), timeout=240)
    assert [r["start"] for r in e] == [ASYNC_STEP] * 4
    assert [r["digest"] for r in e] == [r["digest"] for r in a]


@pytest.mark.parametrize("plan", ["dp4", "fsdp2-dp4", "tp2-pp2", "interleaved"])
def test_reshard_load_is_exact(pool, uninterrupted, tmp_path, plan):
    a_dir, _ = uninterrupted
    reference = _offline(a_dir / "checkpoints" / f"step_{ASYNC_STEP:08d}", tmp_path)
    layout = {"dp4": {"source": "even"}, "fsdp2-dp4": {"source": "even", "zero": 3},
              "tp2-pp2": {"source": "even", "pp": 2, "tp": 2, "num_microbatches": 2},
              "interleaved": _interleaved(tmp_path)}[plan]
    cfg = _config(tmp_path / plan, layout, checkpoint={"dir": str(a_dir / "checkpoints")})
    results = pool.run(cases.load_full, cfg, ASYNC_STEP, timeout=180)
    _check_loaded(results, reference)
    if plan == "interleaved":
        assert all(len(r["stages"]) == 2 for r in results)
    if plan == "fsdp2-dp4":
        assert all(any("FSDP" in w for w in r["wrappers"]) for r in results), results[0]["wrappers"]


def test_two_stages_per_rank_checkpoint_continues_on_fsdp2(pool, uninterrupted, tmp_path):
    a_dir, a = uninterrupted
    i1 = pool.run(cases.run, _config(tmp_path / "i", _interleaved(tmp_path), stop_after=STOP), timeout=240)
    assert i1[0]["end"] == STOP
    i2 = pool.run(cases.run, _config(tmp_path / "i", {"source": "even", "zero": 3}), timeout=240)
    assert [r["start"] for r in i2] == [STOP] * 4 and i2[0]["resumed"]["resharded"]
    final = f"step_{STEPS:08d}"
    diff = _max_diff(_offline(tmp_path / "i" / "checkpoints" / final, tmp_path),
                     _offline(a_dir / "checkpoints" / final, tmp_path))
    assert diff < TOL, f"interleaved -> FSDP2 at step {STEPS}: max |param diff| {diff:.2e} vs TOL {TOL}"
    assert max(abs(x - y) for x, y in zip(i2[0]["losses"], a[0]["losses"][STOP:])) < 1e-3


def test_fewer_ranks_other_cluster_replanned_load_and_continue(uninterrupted, tmp_path):
    """Step 8 of the 2+2 PP x DP run, on 3 ranks (cuda, cuda, ascend) laid out by the planner."""
    a_dir, a = uninterrupted
    reference = _offline(a_dir / "checkpoints" / f"step_{ASYNC_STEP:08d}", tmp_path)
    # each "node" knows only its own chip (HAL_EMULATE=<chip> per rank, as a node's own setting would be):
    # the topology comes from the ranks' chips (hal.trainer.elastic.live_topology), not from one global map
    node = [{"HAL_EMULATE": c, "OMP_NUM_THREADS": "1"} for c in ("cuda", "cuda", "ascend")]
    with WorkerPool(3, env=node) as pool3:
        cfg = _config(tmp_path / "load3", {"source": "auto"}, checkpoint={"dir": str(a_dir / "checkpoints")})
        _check_loaded(pool3.run(cases.load_full, cfg, ASYNC_STEP, timeout=180), reference)
        _copy_ckpt(a_dir, ASYNC_STEP, tmp_path / "s")
        s = pool3.run(cases.run, _config(tmp_path / "s", {"source": "auto"}), timeout=240)
    assert [r["chip"] for r in s] == ["cuda", "cuda", "ascend"]
    assert s[0]["start"] == ASYNC_STEP and s[0]["resumed"]["resharded"] and s[0]["resumed"]["saved_world"] == 4
    final = f"step_{STEPS:08d}"
    diff = _max_diff(_offline(tmp_path / "s" / "checkpoints" / final, tmp_path),
                     _offline(a_dir / "checkpoints" / final, tmp_path))
    assert diff < TOL, f"2+2 -> 2+1 at step {STEPS}: max |param diff| {diff:.2e} vs TOL {TOL}"


def test_moe_expert_parallel_checkpoint_reshards_to_another_placement(pool, tmp_path):
    """The tiny MoE GPT with EP over DP 4 (2 experts per rank) stopped at step 4; loaded into PP 2 x DP 2
    with EP over each stage's 2 replicas (4 experts per rank): every expert lands, exactly, on its new host."""
    moe = {"path": str(ROOT / "examples/models/tiny-moe.toml"), "overrides": {"vocab": 256, "seq": 32}}
    m = _config(tmp_path / "moe", {"source": "even", "ep": True}, model=moe, stop_after=4)
    pool.run(cases.run, m, timeout=240)
    reference = _offline(tmp_path / "moe" / "checkpoints" / "step_00000004", tmp_path)
    assert sum(".experts." in k for k in _model(reference)) == 4 * 8 * 3  # layers x experts x (w1, w2, w3)
    cfg = _config(tmp_path / "moe2", {"source": "even", "ep": True, "pp": 2, "num_microbatches": 2}, model=moe,
                  checkpoint={"dir": str(tmp_path / "moe" / "checkpoints")})
    results = pool.run(cases.load_full, cfg, 4, timeout=180)
    for r in results:
        assert r["resharded"] and r["step"] == 4
        for k, v in r["state"].items():
            assert torch.equal(v, reference[k].to(v.dtype)), f"rank {r['rank']}: {k} differs"
        assert sum(".experts." in k and k.startswith("model.") for k in r["state"]) == 2 * 4 * 3
    held = {k for r in results for k in r["state"]}
    assert not sorted(set(_model(reference)) - held)
