"""Training precision per chip kind (issue 23, item 4; hal.strategies.precision).

In process: the compute dtype each chip profile gets (`auto`: bfloat16 where the profile lists it,
float16 on the fp16-only Ascend 910A), the typed refusal of a dtype a chip lacks (naming rank, chip and
dtype), FSDP2's policy per DP group (16-bit all-gather only when the group agrees; float32 reduce
always), and the loss scaler's GradScaler update rule.

Multi-process, every chip EMULATED on this CPU (torch's CPU autocast does the 16-bit arithmetic):
- emulated cuda:2,ascend:2, one pool, the same `hal train` config in fp32 and in bf16 (2 pipeline
  stages x 2 replicas, ZeRO-2 FSDP2, 2 micro-batches): both learn, and their validation losses agree
  within VAL_TOL nats while not being bitwise equal (bf16 really ran);
- a cluster of one emulated H100 (bfloat16) and one emulated Ascend 910A (no bfloat16) with
  precision = "auto": rank 0 computes in bfloat16, rank 1 in float16, the world scales its loss
  (every step's record has the scale), an overflow on the fp16 rank alone (a NaN gradient injected by
  the test-only [debug] fault) makes BOTH ranks skip that step and halve the scale, and the run trains
  without a dtype error.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from hal.core import catalog
from hal.strategies.precision import LossScaler, Precision, PrecisionError, resolve_dtype
from hal.testing import WorkerPool

from . import _train_cases

ROOT = Path(__file__).resolve().parent.parent
STEPS = 10
# bf16 vs fp32 final validation loss, nats. Why 0.02: bf16 keeps 8 significant bits (relative rounding
# 2^-9 = 0.2% per op); with fp32 master weights, gradients and reduction the two runs follow the same
# trajectory and differ by rounding only (measured: 0.0002 nats after 12 steps). 0.02 leaves 100x
# headroom for other hosts and thread counts and is still ~30x below the ~0.6-0.8 nats both runs move
# from uniform bytes (ln 256 = 5.55) in these steps: a broken bf16 path (no fp32 master weights, a
# 16-bit reduction that loses updates, a wrong loss scale) shows up as a larger gap or no learning.
VAL_TOL = 0.02
STOP = 5  # the loss-scale resume case stops here (after the overflow step)
OVERFLOW_STEP = 3
LEARNED = math.log(256) - 0.5  # both runs must get below this (they reach ~4.7-4.9)
MIXED_SPEC = """name = "h100-910a"
[[sub_clusters]]
name = "cuda"
chip = "cuda"
model = "H100"
nodes = 1
ranks_per_node = 1
emulate = true
[[sub_clusters]]
name = "ascend-910a"
chip = "ascend"
model = "910A"
nodes = 1
ranks_per_node = 1
emulate = true
colocate = true
"""


# ---- in process --------------------------------------------------------------------------------
def test_auto_gives_bf16_where_the_profile_has_it_and_fp16_on_the_910a():
    assert resolve_dtype("auto", catalog.get("cuda", "H100"), 0, "cuda") == "bfloat16"
    assert resolve_dtype("auto", catalog.get("ascend", "910B2"), 2, "ascend") == "bfloat16"
    assert resolve_dtype("auto", catalog.get("ascend", "910A"), 3, "ascend") == "float16"
    assert resolve_dtype("fp32", catalog.get("ascend", "910A"), 3, "ascend") == "float32"
    assert resolve_dtype("fp16", catalog.get("cuda", "H100"), 0, "cuda") == "float16"


def test_a_dtype_the_chip_lacks_is_refused_naming_rank_chip_and_dtype():
    with pytest.raises(PrecisionError, match=r"rank 3: chip 'ascend' \(Huawei Ascend 910A\) has no bfloat16"):
        resolve_dtype("bf16", catalog.get("ascend", "910A"), 3, "ascend")
    with pytest.raises(PrecisionError, match="precision = 'fp8'"):
        resolve_dtype("fp8", catalog.get("cuda", "H100"), 0, "cuda")


def test_fsdp_gathers_16_bit_only_where_the_dp_group_agrees_and_reduces_in_fp32():
    p = Precision(["bfloat16", "bfloat16", "float16", "float32"], rank=1)
    assert p.compute_dtype == torch.bfloat16 and p.loss_scaling
    assert p.fsdp_policy([0, 1]).param_dtype == torch.bfloat16
    assert p.fsdp_policy([1, 2]).param_dtype is None  # a mixed group gathers float32, each rank autocasts
    assert p.fsdp_policy([3]).param_dtype is None
    assert all(p.fsdp_policy(g).reduce_dtype == torch.float32 for g in ([0, 1], [1, 2], [3]))
    assert not Precision(["bfloat16", "float32"], 0).loss_scaling
    with pytest.raises(PrecisionError):
        Precision(["bfloat16", "int8"], 0)


def test_loss_scaler_follows_grad_scaler_rules():
    s = LossScaler(init_scale=8.0, growth_interval=2)
    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.tensor([8.0, 16.0, -8.0])
    assert s.unscale_([p]) is False and torch.equal(p.grad, torch.tensor([1.0, 2.0, -1.0]))
    p.grad = torch.tensor([1.0, float("inf"), 0.0])
    assert s.unscale_([p]) is True
    s.update(True)
    assert s.scale == 4.0 and s.skipped == 1  # back off on an overflow
    s.update(False)
    assert s.scale == 4.0
    s.update(False)
    assert s.scale == 8.0  # grow after growth_interval clean steps
    with pytest.raises(PrecisionError):
        LossScaler(backoff_factor=1.5)


# ---- multi-process -----------------------------------------------------------------------------
def _config(run_dir: Path, precision: str, **plan) -> dict:
    return {"seed": 1, "steps": STEPS, "global_batch": 8, "backend": "hetero", "timeout_s": 60,
            "model": {"path": str(ROOT / "examples/models/tiny.toml"), "overrides": {"vocab": 256, "seq": 32}},
            "data": {"max_bytes": 1 << 18}, "optimizer": {"lr": 3e-3, "warmup_steps": 2},
            "plan": {"source": "even", **plan}, "checkpoint": {"enabled": False},
            "train": {"precision": precision},
            "log": {"dir": str(run_dir), "val_interval": 0, "val_batches": 1, "plots": False}}


def test_bf16_and_fp32_runs_reach_the_same_validation_loss(tmp_path, shared_pools):
    plan = {"pp": 2, "zero": 2, "num_microbatches": 2}
    pool = shared_pools.get(4, {"HAL_EMULATE": "cuda:2,ascend:2", "OMP_NUM_THREADS": "1"})  # one pool for test_train, test_trainer_resume, test_precision, test_meta_build (tests/conftest.py)
    fp32 = pool.run(_train_cases.run, _config(tmp_path / "fp32", "fp32", **plan), timeout=240)
    bf16 = pool.run(_train_cases.run, _config(tmp_path / "bf16", "bf16", **plan), timeout=240)
    a, b = fp32[0]["final_val_loss"], bf16[0]["final_val_loss"]
    print(f"final validation loss after {STEPS} steps, emulated cuda:2,ascend:2: fp32 {a:.4f}, bf16 {b:.4f}, "
          f"|difference| {abs(a - b):.4f} nats (tolerance {VAL_TOL})")
    assert a < LEARNED and b < LEARNED
    assert abs(a - b) <= VAL_TOL
    assert a != b  # bf16 compute really ran (a bitwise-equal loss would mean it did not)
    chips = json.loads((tmp_path / "bf16" / "summary.json").read_text())["chips"]
    assert [c["dtype"] for c in chips] == ["bfloat16"] * 4


def test_a_bf16_chip_and_an_fp16_only_chip_train_together_with_loss_scaling(tmp_path):
    spec = tmp_path / "h100-910a.toml"
    spec.write_text(MIXED_SPEC)
    with WorkerPool(2, env={"HAL_CLUSTER": str(spec), "OMP_NUM_THREADS": "1"}) as pool:
        # an overflow on the fp16 rank only (its gradient made NaN after step 3's backward): every rank skips
        config = _config(tmp_path / "mixed", "auto", zero=2)
        config["debug"] = {"faults": [{"action": "nan_grad", "rank": 1, "step": OVERFLOW_STEP}]}
        out = pool.run(_train_cases.run, config, timeout=240)
        # the loss scale is part of each checkpoint: a run stopped after the overflow resumes at the halved
        # scale, not at GradScaler's initial one (the same config, stopped at STOP, then resumed to STEPS)
        resumed = {**_config(tmp_path / "resumed", "auto", zero=2), "debug": config["debug"],
                   "checkpoint": {"interval": STOP}}
        pool.run(_train_cases.run, {**resumed, "stop_after": STOP}, timeout=240)
        pool.run(_train_cases.run, resumed, timeout=240)
    saved = json.loads((tmp_path / "resumed" / "checkpoints" / f"step_{STOP:08d}" / "data.json").read_text())
    assert saved["loss_scaler"] == {"scale": 2.0 ** 15, "clean_steps": STOP - OVERFLOW_STEP, "skipped": 1}
    after = [json.loads(x) for x in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss_scale"] for r in after if r["step"] > STOP] == [2.0 ** 15] * (STEPS - STOP)
    summary = json.loads((tmp_path / "mixed" / "summary.json").read_text())
    assert [(c["chip"], c["dtype"]) for c in summary["chips"]] == [("cuda", "bfloat16"), ("ascend", "float16")]
    records = [json.loads(x) for x in (tmp_path / "mixed" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == STEPS and all(r["loss_scale"] > 0 for r in records)
    skipped = sum(r["amp_skipped"] for r in records)
    val = out[0]["final_val_loss"]
    print(f"bf16 H100 + fp16 910A (both EMULATED): final validation loss {val:.4f}, loss scale "
          f"{records[0]['loss_scale']:g} -> {records[-1]['loss_scale']:g}, {skipped} step(s) skipped on overflow")
    assert [r["amp_skipped"] for r in records] == [int(r["step"] == OVERFLOW_STEP) for r in records]
    scales = [r["loss_scale"] for r in records]  # GradScaler's init scale, halved by the agreed overflow
    assert scales == [2.0 ** 16] * (OVERFLOW_STEP - 1) + [2.0 ** 15] * (STEPS - OVERFLOW_STEP + 1)
    assert "nonfinite_skipped" not in records[-1]  # a loss-scale overflow is not a non-finite failure
    assert val < LEARNED
