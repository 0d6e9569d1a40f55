"""Mid-run re-plan on a slow node (hal/trainer/replan.py), end to end through `hal train --max-restarts 1`: on
a TIMED-emulated 2 cuda + 2 ascend cluster (every chip EMULATED on this CPU) with cuda rank 1's chip
throttled x4 (`[debug] throttle`, test only) and `slow_node.replan = true`, the slow-node check confirms
rank 1 after `window` steps; every rank writes a checkpoint and leaves with EXIT_REPLAN, torchrun restarts
the job, and the new job runs on `<run dir>/replan.json` - rank 1's replica with fewer rows than its cuda
peer - resuming from that checkpoint with no step lost, and finishes. The job runs under a timeout and
is killed with its processes past it (no hang outlives the test); it is two torchrun starts of 4 ranks.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from ._hal_train_job import run_hal_train

ROOT = Path(__file__).resolve().parent.parent
JOB_LIMIT_S = 240


def _config(path: Path, run_dir: Path) -> Path:
    path.write_text(f"""
seed = 3
steps = 10
global_batch = 8
backend = "hetero"
timeout_s = 30
[model]
path = "{ROOT / 'examples/models/tiny.toml'}"
overrides = {{ vocab = 256, seq = 32 }}
[data]
max_bytes = 524288
[optimizer]
warmup_steps = 2
[cluster]
emulate = "cuda:2,ascend:2"
timed = true
time_scale = 5e4
timed_dtype = "bfloat16"
[plan]
source = "even"
[checkpoint]
interval = 0
[slow_node]
threshold = 0.5
window = 3
replan = true
[log]
dir = "{run_dir}"
val_interval = 0
val_batches = 1
print_interval = 1
plots = false
[debug]
throttle = {{ 1 = 4.0 }}
""")
    return path


def test_throttled_rank_is_replanned_mid_run_and_training_finishes(tmp_path):
    run = tmp_path / "run"
    config = _config(tmp_path / "r.toml", run)
    proc = run_hal_train(config, 1, JOB_LIMIT_S)
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:]
    s = json.loads((run / "summary.json").read_text())
    (rp,) = s["replans"]
    assert rp["ranks"] == [1] and rp["chips"] == ["cuda"] and rp["action"] == "restart", rp
    assert 3 <= rp["step"] < 10 and rp["resumed_from_step"] == rp["step"] and rp["steps_lost"] == 0
    assert rp["applied"] and rp["rows_before"] == {"1": 2} and rp["rows_after"]["1"] < 2
    assert rp["restart_s"] > 0 and rp["attempt"] == 1
    assert rp["old_plan"] == ["stage 0: [0]x2, [1]x2, [2]x2, [3]x2"] and rp["new_plan"] != rp["old_plan"]
    # the job that finished ran the new plan: rank 1 reads fewer rows than its cuda peer, same global batch
    rows = s["rank_rows"]
    assert rows[1] < rows[0] and sum(rows) == 8, rows
    assert [r["microbatch"] for r in s["plan"]["stages"][0]["replicas"]] == rows
    assert s["start_step"] == rp["step"] and s["end_step"] == 10 and s["attempt"] == 1
    assert s["restarts"] == [] and not (run / "faults").exists()  # a re-plan is not a failure
    assert math.isfinite(s["final_val_loss"]) and s["final_val_loss"] < math.log(256)
    assert "exits with code 75" in out and "restarted for the re-plan" in out and "hal train: re-planned:" in out
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in steps}) == list(range(1, 11))
    assert {r["step"]: r["attempt"] for r in steps}[rp["step"] + 1] == 1
    assert [r["step"] for r in steps if "replan" in r] == [rp["step"] + 1]
