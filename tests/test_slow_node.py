"""Slow-node detection (trainer/slow_node.py): the detector names a rank whose compute is above its
expected time by more than the threshold and no one when all are alike; HAL_TRAIN_THROTTLE is parsed
strictly; the re-plan gives a slow replica fewer rows; and on an emulated 2 cuda + 2 ascend cluster
with TIMED emulation (every chip EMULATED on CPU; hal.timed charges each op at the chip's speed) the
slow-node check of `hal train` names the throttled rank (a cuda rank slowed x4), and names none
without a throttle. The time scale is low (5e4: the host is often slower than the chips, which the
detector does not see: it reads the chips' device time) to keep the module short."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hal.testing import WorkerPool
from trainer.slow_node import SlowNodeDetector, ThrottleSpecError, parse_throttle, replan

from . import _metrics_cases

ROOT = Path(__file__).resolve().parent.parent
EMULATE = "cuda:2,ascend:2"


def test_detector_names_the_slow_rank_and_no_one_otherwise():
    speeds = [(1e9, 1e9)] * 4
    det = SlowNodeDetector(0.5, 3, ["cuda", "cuda", "ascend", "ascend"], [0.25] * 4, speeds, timed=True)
    found = []
    for _ in range(3):
        found = det.update([1.0, 1.1, 3.2, 0.9], [1e9] * 4, [0.0] * 4)
    assert [f["rank"] for f in found] == [2] and found[0]["slowdown"] > 2.5
    calm = SlowNodeDetector(0.5, 3, ["a"] * 4, [0.25] * 4, speeds, timed=True)
    for _ in range(5):
        assert calm.update([1.0, 1.2, 0.9, 1.1], [1e9] * 4, [0.0] * 4) == []
    # untimed: expected = work share; a rank with twice the rows may take twice the time
    det = SlowNodeDetector(0.5, 2, ["a"] * 3, [0.5, 0.25, 0.25], [(0.0, 0.0)] * 3, timed=False)
    for _ in range(2):
        assert det.update([2.0, 1.0, 1.0], [0.0] * 3, [0.0] * 3) == []


def test_throttle_spec_is_strict():
    assert parse_throttle("2:3") == {2: 3.0} and parse_throttle("1:2, 3:4.5") == {1: 2.0, 3: 4.5}
    for bad in ("2", "x:3", "2:0.5", "-1:2"):
        with pytest.raises(ThrottleSpecError, match="HAL_TRAIN_THROTTLE"):
            parse_throttle(bad)


def test_replan_weights_the_slow_replica_down():
    from hal.topology import Topology
    from strategies.models import ModelConfig
    from strategies.plan import Plan
    topo = Topology.from_env({"HAL_EMULATE": EMULATE})
    mc = ModelConfig(name="t", layers=2, hidden=32, heads=4, ffn=64, vocab=256, seq=32)
    plan = Plan.even(topo, mc, 16, 2)
    new = replan(plan, [1.0, 1.0, 3.0, 1.0])
    rows = [r.microbatch for r in new.stages[0].replicas]
    assert sum(rows) == 8 and rows[2] < rows[3] and rows[2] >= 1
    new.check(topo, mc)


def _config(run_dir: Path) -> dict:
    return {"seed": 1, "steps": 6, "global_batch": 8, "backend": "hetero", "timeout_s": 60,
            "model": {"path": str(ROOT / "examples/models/tiny.toml"), "overrides": {"vocab": 256, "seq": 32}},
            "data": {"max_bytes": 1 << 19}, "optimizer": {"warmup_steps": 2},
            "plan": {"source": "even"}, "checkpoint": {"enabled": False},
            "slow_node": {"threshold": 0.5, "window": 3, "replan": True},
            "log": {"dir": str(run_dir), "val_interval": 0, "val_batches": 1}}


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(4, env={"HAL_EMULATE": EMULATE, "OMP_NUM_THREADS": "1", "HAL_EMULATE_TIMED": "1",
                                    "HAL_EMULATE_TIME_SCALE": "5e4"}) as p:
        yield p


def test_slow_node_names_the_throttled_rank(pool, tmp_path):
    pool.run(_metrics_cases.run, _config(tmp_path / "t"), "1:4", timeout=240)
    s = json.loads((tmp_path / "t" / "summary.json").read_text())
    assert s["timed_emulation"] is True
    assert [f["rank"] for f in s["slow_nodes"]] == [1], s["slow_nodes"]
    assert s["slow_nodes"][0]["chip"] == "cuda" and s["slow_nodes"][0]["slowdown"] > 2.0
    assert s["throttled"] == [{"rank": 1, "factor": 4.0}]
    new = json.loads(Path(s["replan"]).read_text())  # rank 1's replica gets fewer rows than its cuda peer
    rows = [r["microbatch"] for r in new["stages"][0]["replicas"]]
    assert sum(rows) == 8 and rows[1] < rows[0]

    pool.run(_metrics_cases.run, _config(tmp_path / "calm"), None, timeout=240)
    calm = json.loads((tmp_path / "calm" / "summary.json").read_text())
    assert calm["slow_nodes"] == [] and calm["throttled"] == [] and "replan" not in calm
