"""Slow-node and slow-link detection (hal/trainer/slow_node.py, hal/trainer/link_watch.py): the detectors name a
rank whose compute (or link issue time) is above its expected time (its peers') by more than the
threshold and no one when all are alike; the test-only `[debug]` throttle and link delay are checked
strictly by the config; the re-plan gives a slow replica fewer rows; and on an emulated 2 cuda + 2 ascend cluster
with TIMED emulation (every chip EMULATED on CPU; hal.emulation.timed charges each op at the chip's speed) the
checks of `hal train` name the throttled rank (a cuda rank slowed x4) as a slow NODE and not as a slow
link, the link-delayed rank (an ascend rank whose every collective submission sleeps 0.1 s) as a slow
LINK across the bridge and not as a slow node (each run is the other check's healthy case: the
throttled run names no slow link, the link-delayed run no slow node and no re-plan). Outside torchrun the
mid-run re-plan is only recommended (replan.json written, training goes on); the restart itself is
tests/test_slow_node_replan.py. The time scale is low (5e4: the host is often slower than the chips,
which the compute detector does not see: it reads the chips' device time) to keep the module short."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hal.testing import WorkerPool
from hal.trainer.config import TrainConfig, TrainConfigError
from hal.trainer.replan import restarts_left
from hal.trainer.slow_node import SlowLinkDetector, SlowNodeDetector, name_link, replan

from . import _slow_node_cases

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


def _debug(tmp_path, **debug) -> TrainConfig:
    return TrainConfig(**{**_config(tmp_path), "debug": debug})


def test_throttle_spec_is_strict(tmp_path):
    assert _debug(tmp_path, throttle={2: 3}).debug.throttle == {2: 3.0}
    assert _debug(tmp_path, throttle={"1": 2, "3": 4.5}).debug.throttle == {1: 2.0, 3: 4.5}
    for bad, field in (({"x": 3}, "debug.throttle.x"), ({2: 0.5}, "debug.throttle[2] = 0.5"),
                       ({-1: 2}, "debug.throttle[-1] = 2"), ({2: "fast"}, "debug.throttle[2] = 'fast'")):
        with pytest.raises(TrainConfigError, match=re.escape(field)):
            _debug(tmp_path, throttle=bad)


def test_link_detector_names_the_rank_that_holds_its_peers_up():
    chips = ["cuda", "cuda", "ascend", "ascend"]
    det = SlowLinkDetector(0.5, 0.1, 3, chips)
    found = []
    for _ in range(3):  # rank 2 spends 200 ms of a 700 ms step submitting; its peers wait for it
        found = det.update([0.0004, 0.0003, 0.2, 0.0005], [0.7] * 4, [0.25, 0.25, 0.05, 0.25])
    assert [f["rank"] for f in found] == [2] and found[0]["excess_s"] > 0.19 and found[0]["peers_wait_s"] == 0.25
    calm = SlowLinkDetector(0.5, 0.1, 3, chips)
    for _ in range(5):  # a noisy but healthy host: ms of jitter, far below 10% of the step
        assert calm.update([0.0004, 0.005, 0.0002, 0.002], [0.7] * 4, [0.2] * 4) == []
    # which link: its sends to rank 3 across the bridge, not the all_reduce it shares with everyone
    per_rank = [{"[0, 1, 2, 3]: all_reduce": (0.001, 10), "[0, 1, 2, 3]: send to 2": (0.001, 10)},
                {"[0, 1, 2, 3]: all_reduce": (0.001, 10)},
                {"[0, 1, 2, 3]: all_reduce": (0.0012, 10), "[0, 1, 2, 3]: send to 3": (1.0, 10)},
                {"[0, 1, 2, 3]: all_reduce": (0.001, 10)}]
    link = name_link(2, per_rank, chips)
    assert link["peer"] == 3 and not link["across_bridge"] and "inside the ascend sub-cluster" in link["what"]
    per_rank[2]["[0, 1, 2, 3]: all_reduce"] = (2.0, 10)
    link = name_link(2, per_rank, chips)
    assert link["peer"] is None and link["across_bridge"] and link["group"] == [0, 1, 2, 3], link


def test_link_delay_spec_is_strict_and_restarts_left_reads_torchrun(tmp_path):
    assert _debug(tmp_path, link_delay={2: 0.05}).debug.link_delay == {2: 0.05}
    for bad, field in (({"x": 0.1}, "debug.link_delay.x"), ({2: 0}, "debug.link_delay[2] = 0"),
                       ({2: 5}, "debug.link_delay[2] = 5"), ({-1: 0.1}, "debug.link_delay[-1] = 0.1")):
        with pytest.raises(TrainConfigError, match=re.escape(field)):
            _debug(tmp_path, link_delay=bad)
    with pytest.raises(TrainConfigError, match=r"debug\.faults\[0\]\.action = 'boom'"):
        _debug(tmp_path, faults=[{"action": "boom", "rank": 1, "step": 2}])
    with pytest.raises(TrainConfigError, match=r"debug\.faults\[0\]\.step = 0"):
        _debug(tmp_path, faults=[{"action": "kill", "rank": 1, "step": 0}])
    assert restarts_left({}) is None
    run = {"TORCHELASTIC_RUN_ID": "x", "TORCHELASTIC_MAX_RESTARTS": "1", "TORCHELASTIC_RESTART_COUNT": "0"}
    assert restarts_left(run) == 1 and restarts_left({**run, "TORCHELASTIC_RESTART_COUNT": "1"}) == 0
    assert restarts_left({**run, "TORCHELASTIC_MAX_RESTARTS": "0"}) == 0


def test_replan_weights_the_slow_replica_down():
    from hal.core.topology import Topology
    from hal.strategies.models import ModelConfig
    from hal.strategies.plan import Plan
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
            "log": {"dir": str(run_dir), "val_interval": 0, "val_batches": 1, "plots": False}}


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(4, env={"HAL_EMULATE": EMULATE, "OMP_NUM_THREADS": "1", "HAL_EMULATE_TIMED": "1",
                                    "HAL_EMULATE_TIME_SCALE": "5e4",
                                    "HAL_EMULATE_TIMED_DTYPE": "bfloat16"}) as p:  # fp32 ops; 910B2 has no fp32 figure
        yield p


def test_slow_node_names_the_throttled_rank(pool, tmp_path):
    pool.run(_slow_node_cases.run, {**_config(tmp_path / "t"), "debug": {"throttle": {1: 4.0}}}, timeout=240)
    s = json.loads((tmp_path / "t" / "summary.json").read_text())
    assert s["timed_emulation"] is True
    assert [f["rank"] for f in s["slow_nodes"]] == [1], s["slow_nodes"]
    assert s["slow_nodes"][0]["chip"] == "cuda" and s["slow_nodes"][0]["slowdown"] > 2.0
    assert s["throttled"] == [{"rank": 1, "factor": 4.0}]
    assert s["slow_links"] == [], s["slow_links"]  # a slow chip is not a slow link: its submissions are quick
    new = json.loads(Path(s["replan"]).read_text())  # rank 1's replica gets fewer rows than its cuda peer
    rows = [r["microbatch"] for r in new["stages"][0]["replicas"]]
    assert sum(rows) == 8 and rows[1] < rows[0]
    # not under torchrun: the mid-run re-plan is recommended (replan.json written then), training went on
    (rec,) = s["replan_recommended"]
    assert rec["ranks"] == [1] and rec["why"] == "not under torchrun"
    assert rec["rows_after"]["1"] < rec["rows_before"]["1"]
    assert s["replans"] == [] and s["end_step"] == 6 and s["rank_rows"] == [2, 2, 2, 2]
    assert s["link_delayed"] == [] and s["link_measure"]["measured"] is True


def test_slow_link_names_the_delayed_rank(pool, tmp_path):
    """Rank 2 (ascend) sleeps 0.1 s before each collective it submits (debug.link_delay, test only):
    the slow-link check names it and its link (the DP all_reduce, across the bridge); the compute check,
    which reads the chips' device time, names no one."""
    pool.run(_slow_node_cases.run, {**_config(tmp_path / "l"), "debug": {"link_delay": {2: 0.1}}}, timeout=240)
    s = json.loads((tmp_path / "l" / "summary.json").read_text())
    assert s["link_delayed"] == [{"rank": 2, "seconds": 0.1}]
    assert [f["rank"] for f in s["slow_links"]] == [2], s["slow_links"]
    f = s["slow_links"][0]
    assert f["chip"] == "ascend" and f["excess_s"] > 0.1 and f["peers_issue_s"] < 0.05
    assert f["link"]["across_bridge"] and f["link"]["group"] == [0, 1, 2, 3], f["link"]
    # no healthy chip is named a slow node, and so nothing is re-planned (each check's "no one" on a healthy
    # part of the cluster: the compute check here, the link check in the throttled run above)
    assert s["slow_nodes"] == [] and s["throttled"] == [], s["slow_nodes"]
    assert "replan" not in s and s["replan_recommended"] == [] and s["link_measure"]["measured"] is True
    recs = [json.loads(x) for x in (tmp_path / "l" / "metrics.jsonl").read_text().splitlines()]
    assert all(len(r["rank_link_issue_s"]) == 4 for r in recs) and "slow_link_ranks" in recs[-1]
