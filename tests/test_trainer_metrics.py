"""`hal train` metrics (hal/trainer/metrics.py, plots.py, parts.py, report.py): work shares and the bubble
formula, the config a --measure-parts run writes reads back as the same config, a cluster spec is
split into one-sub-cluster specs the launcher accepts, efficiency from the parts' summaries, the PNG
plots; and on an emulated 2 cuda + 1 kunlun + 1 ascend cluster (every chip
EMULATED on CPU, collectives over the `hetero` bridge): the GPT and the MoE model (EP: each rank holds
other experts) lower validation loss well below ln 256, the MoE run repeats bit-identically (final
parameters, loss trace, grad norms; the GPT's bitwise repeat is tests/test_trainer_resume.py's), every
step's JSONL record carries the per-rank and per-chip figures, and step 1's gradient norm equals the
single-process model's. The step's split into compute / communication / pipeline bubble is MEASURED
(hal.emulation.timed's timeline attributes the chip's idle time to the p2p op or collective it waited for; a
fake clock checks that), and a short TIMED run shows it: a 2-stage pipeline has a bubble on every
rank, pure DP has none and spends time in communication."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from hal.testing import WorkerPool
from hal.trainer.config import TrainConfig
from hal.trainer.metrics import bubble_estimate, read_metrics, split_step, work_shares

from . import _metrics_cases, _split_cases

ROOT = Path(__file__).resolve().parent.parent
EMULATE = "cuda:2,kunlun:1,ascend:1"
CHIPS = ["cuda", "cuda", "kunlun", "ascend"]
STEPS = 12  # lr 1e-2: validation loss ~3.7 by step 12 (single-process replay: GPT 3.69, MoE 3.68)


def _config(run_dir: Path, **extra) -> dict:
    cfg = {"seed": 5, "steps": STEPS, "global_batch": 8, "backend": "hetero", "timeout_s": 60,
           "model": {"path": str(ROOT / "examples/models/tiny.toml"), "overrides": {"vocab": 256, "seq": 32}},
           "data": {"max_bytes": 1 << 20},
           "optimizer": {"lr": 1e-2, "warmup_steps": 2},
           "plan": {"source": "even"},
           "checkpoint": {"enabled": False},
           "log": {"dir": str(run_dir), "val_interval": 6, "val_batches": 2, "plots": False}}  # the GPT run draws them
    cfg.update(extra)
    return cfg


def test_work_shares_and_bubble():
    from hal.core.topology import Topology
    from hal.strategies.models import ModelConfig
    from hal.strategies.plan import Plan
    topo = Topology.from_env({"HAL_EMULATE": "cuda:3,ascend:1"})
    mc = ModelConfig(name="t", layers=4, hidden=32, heads=4, ffn=64, vocab=256, seq=32)
    even = Plan.even(topo, mc, 16, 2)
    assert work_shares(even, mc, 4) == pytest.approx([0.25] * 4)
    weighted = Plan.weighted(topo, mc, 16, {"cuda": 3.0, "ascend": 1.0}, num_microbatches=2)
    shares = work_shares(weighted, mc, 4)
    assert sum(shares) == pytest.approx(1.0) and shares[0] > shares[3]
    pp = Plan.even(topo, mc, 16, 4, pp=2)
    assert sum(work_shares(pp, mc, 4)) == pytest.approx(1.0)
    assert bubble_estimate(pp) == pytest.approx(1 / 5) and bubble_estimate(even) == 0.0


def test_parts_configs_round_trip_through_toml(tmp_path):
    from hal.trainer.parts import part_configs, to_toml
    cfg = TrainConfig(**_config(tmp_path / "run", cluster={"emulate": EMULATE, "timed": True, "time_scale": 3e5},
                                plan={"source": "auto"}))
    parts = dict(part_configs(cfg))
    assert list(parts) == ["cuda-2", "cuda-2-even", "kunlun-1", "ascend-1", "even"]
    for name, data in parts.items():
        path = tmp_path / f"{name}.toml"
        path.write_text(to_toml(data))
        back = TrainConfig.from_toml(path)
        assert back.model_dump() == TrainConfig(**data).model_dump(), name
        assert back.stop_after == cfg.efficiency.steps and back.cluster.timed and back.efficiency.part
    assert parts["kunlun-1"]["cluster"]["emulate"] == "kunlun:1" and parts["kunlun-1"]["plan"]["source"] == "auto"
    assert parts["even"]["plan"]["source"] == "even" and parts["even"]["cluster"]["emulate"] == EMULATE
    # an even main run is its own Plan.even measurement
    assert "even" not in dict(part_configs(TrainConfig(**_config(tmp_path / "r2", cluster={"emulate": EMULATE}))))


SPEC = """name = "mini"
[[sub_clusters]]
name = "gpu"
chip = "cuda"
model = "H100"
nodes = 1
ranks_per_node = 2
emulate = true
intra_bandwidth = "400 GB/s"

[[sub_clusters]]
name = "xpu"
chip = "kunlun"
nodes = 1
ranks_per_node = 1
emulate = true
colocate = true
"""


def test_parts_of_a_cluster_spec_are_one_sub_cluster_specs(tmp_path, monkeypatch):
    """--measure-parts on `cluster.spec`: each [[sub_clusters]] entry runs alone from its own spec file
    (model, bandwidth and emulate flag kept, colocate dropped), the whole spec runs Plan.even, and the
    launcher (hal.cli.train.plan) takes each written config: the part's ranks and chips, no torchrun."""
    import argparse

    from hal.cli.train import plan as launch_plan
    from hal.core.cluster import load_cluster_spec
    from hal.trainer.parts import efficiency, measure, part_configs
    monkeypatch.delenv("HAL_EMULATE", raising=False)  # the config's spec is the cluster
    (tmp_path / "spec.toml").write_text(SPEC)
    cfg = TrainConfig(**_config(tmp_path / "run", cluster={"spec": str(tmp_path / "spec.toml"), "timed": True},
                                plan={"source": "auto"}, global_batch=12))  # 12 rows: Plan.even on 3 ranks
    parts = dict(part_configs(cfg))
    assert list(parts) == ["gpu-2", "gpu-2-even", "xpu-1", "even"]
    assert parts["even"]["cluster"] == {**parts["even"]["cluster"], "spec": str(tmp_path / "spec.toml"), "emulate": None}
    seen = {}

    def fake_run(ns):  # what `hal train` would launch for this part, checked as the launcher checks it
        c = TrainConfig.from_toml(ns.config)
        nproc, _, source, chips = launch_plan(c, ns, {})
        seen[Path(ns.config).parent.name] = (nproc, [ch for ch, _ in chips], c)
        return 0
    assert measure(argparse.Namespace(config=None), cfg, fake_run) == 0
    assert {k: v[:2] for k, v in seen.items()} == {"gpu-2": (2, ["cuda", "cuda"]), "gpu-2-even": (2, ["cuda", "cuda"]),
                                                   "xpu-1": (1, ["kunlun"]), "even": (3, ["cuda", "cuda", "kunlun"])}
    gpu = load_cluster_spec(tmp_path / "run" / "parts" / "gpu-2" / "cluster.toml")
    assert [(x.name, x.model, x.intra_bandwidth, x.world_size) for x in gpu.sub_clusters] == [("gpu", "H100", 4e11, 2)]
    xpu = load_cluster_spec(tmp_path / "run" / "parts" / "xpu-1" / "cluster.toml")
    assert [(x.chip, x.colocate, x.emulate) for x in xpu.sub_clusters] == [("kunlun", False, True)]
    assert all(c.cluster.timed and c.stop_after == cfg.efficiency.steps for _, _, c in seen.values())
    for name, tps in (("gpu-2", 50.0), ("gpu-2-even", 60.0), ("xpu-1", 20.0), ("even", 40.0)):
        (tmp_path / "run" / "parts" / name / "summary.json").write_text(json.dumps({"tokens_per_s_median": tps}))
    eff = efficiency(cfg, 76.0)
    assert eff["parts"] == {"gpu-2": 60.0, "xpu-1": 20.0} and eff["efficiency"] == pytest.approx(0.95)


def test_efficiency_from_parts_summaries(tmp_path):
    from hal.trainer.parts import efficiency, report
    cfg = TrainConfig(**_config(tmp_path, cluster={"emulate": "cuda:2,ascend:2"}, plan={"source": "auto"}))
    assert efficiency(cfg, 100.0)["efficiency"] is None  # nothing measured yet: said, not invented
    for name, tps in (("cuda-2", 55.0), ("cuda-2-even", 60.0), ("ascend-2", 40.0), ("ascend-2-even", 30.0),
                      ("even", 70.0)):
        (tmp_path / "parts" / name).mkdir(parents=True)
        (tmp_path / "parts" / name / "summary.json").write_text(json.dumps({"tokens_per_s_median": tps}))
    eff = efficiency(cfg, 96.0)
    assert eff["parts_sum_tokens_per_s"] == 100.0  # each sub-cluster's best measured layout
    assert eff["parts_layout"] == {"cuda-2": "Plan.even", "ascend-2": "plan auto"}
    assert eff["efficiency"] == pytest.approx(0.96) and eff["even_efficiency"] == pytest.approx(0.70)
    text = "\n".join(report(eff, True, "auto"))
    assert "MIXED-CLUSTER EFFICIENCY" in text and "96.0%" in text and "70.0%" in text


def test_plots_written(tmp_path):
    from hal.trainer.plots import plot_run
    with open(tmp_path / "metrics.jsonl", "w") as f:
        for s in range(1, 6):
            rec = {"step": s, "loss": 5.0 - s * 0.1, "tokens_per_s": 100.0, "rank_step_s": [0.1, 0.2],
                   "rank_compute_s": [0.05, 0.15], "tokens_per_s_chip": {"cuda": 60.0, "ascend": 40.0},
                   "rank_bubble_s": [0.02, 0.0], "rank_comm_s": [0.02, 0.05], "rank_other_s": [0.01, 0.0]}
            if s == 5:
                rec["val_loss"] = 4.6
            f.write(json.dumps(rec) + "\n")
    out = plot_run(tmp_path, ["cuda", "ascend"])
    assert [p.name for p in out] == ["loss.png", "rank_step_time.png", "tokens_per_chip.png", "rank_time_split.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in out)


def test_plots_of_a_run_whose_world_shrank(tmp_path):
    # hal/trainer/elastic.py: a run restarted on 2 of its 4 ranks has records of both world sizes
    from hal.trainer.plots import plot_run
    with open(tmp_path / "metrics.jsonl", "w") as f:
        for s in range(1, 7):
            n = 4 if s <= 3 else 2
            f.write(json.dumps({"step": s, "loss": 5.0 - s * 0.1, "tokens_per_s": 100.0, "rank_step_s": [0.1] * n,
                                "rank_compute_s": [0.05] * n, "rank_bubble_s": [0.01] * n, "rank_comm_s": [0.02] * n,
                                "rank_other_s": [0.02] * n,
                                "tokens_per_s_chip": {"cuda": 60.0, "ascend": 40.0} if n == 4 else {"cuda": 90.0}})
                    + "\n")
    out = plot_run(tmp_path, ["cuda", "cuda"])
    assert [p.name for p in out] == ["loss.png", "rank_step_time.png", "tokens_per_chip.png", "rank_time_split.png"]


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(4, env={"HAL_EMULATE": EMULATE, "OMP_NUM_THREADS": "1"}) as p:
        yield p


def _run(pool, config: dict) -> list[dict]:
    return pool.run(_metrics_cases.run, config, timeout=240)


def _reference_grad_norm(cfg: dict) -> float:
    """Step 1's gradient norm of the single-process model on the same global batch."""
    from hal.strategies.models import build_model
    from hal.strategies.models.data import count_tokens, lm_loss_sum
    from hal.trainer.data import Corpus, train_batch
    tc = TrainConfig(**cfg)
    mc = tc.load_model_config()
    model = build_model(mc, tc.seed)
    x, y = train_batch(Corpus.from_config(tc), tc.seed, 0, tc.global_batch, mc.seq)
    (lm_loss_sum(model(x), y) / count_tokens(y)).backward()
    return float(torch.sqrt(sum(p.grad.double().pow(2).sum() for p in model.parameters() if p.grad is not None)))


def test_gpt_on_2_1_1_metrics_and_grad_norm(pool, tmp_path):
    cfg = _config(tmp_path / "gpt", plan={"source": "even", "pp": 2, "num_microbatches": 2})
    cfg["log"]["plots"] = True  # this run's PNGs are checked below
    out = _run(pool, cfg)
    assert [r["chip"] for r in out] == CHIPS
    val = out[0]["final_val_loss"]
    assert val < math.log(256) - 1.0, f"validation loss {val:.3f} not well below ln 256"
    recs = read_metrics(tmp_path / "gpt" / "metrics.jsonl")
    assert [r["step"] for r in recs] == list(range(1, STEPS + 1))
    r = recs[-1]
    for key in ("loss", "grad_norm", "lr", "tokens_per_s", "rank_step_s", "rank_compute_s", "rank_wait_s",
                "rank_wait_share", "bubble_est", "rank_bubble_s", "rank_comm_s", "rank_other_s",
                "rank_compute_share", "rank_comm_share", "rank_bubble_share", "tokens_per_s_chip", "mfu_chip"):
        assert key in r, key
    # untimed: the host's view; every rank of a 2-stage pipeline blocks in receives (HeteroPipeline)
    assert all(sum(x["rank_bubble_s"][i] for x in recs) > 0 for i in range(4))
    assert all(x["rank_comm_s"][i] is not None and x["rank_comm_s"][i] >= 0 for x in recs for i in range(4))
    assert len(r["rank_step_s"]) == 4 and set(r["tokens_per_s_chip"]) == {"cuda", "kunlun", "ascend"}
    assert sum(r["tokens_per_s_chip"].values()) == pytest.approx(r["tokens_per_s"])
    assert r["bubble_est"] == pytest.approx(1 / 3)  # 2 stages, 2 micro-batches: (p-1)/(m+p-1)
    assert recs[0]["grad_norm"] == pytest.approx(_reference_grad_norm(cfg), rel=1e-4)
    s = json.loads((tmp_path / "gpt" / "summary.json").read_text())
    assert [c["chip"] for c in s["chips"]] == CHIPS and s["final_val_loss"] == val
    assert s["efficiency"] is None and "efficiency_note" in s and "even_efficiency" in s
    assert s["timed_emulation"] is False and "says nothing about the chip" in s["mfu_peaks"]["cuda"]["used"]
    assert all((tmp_path / "gpt" / n).is_file()
               for n in ("loss.png", "rank_step_time.png", "tokens_per_chip.png", "rank_time_split.png"))
    assert len(s["rank_bubble_share_median"]) == 4 and "blocked in pipeline receives" in s["split_measure"]
    assert len({x["digest"] for x in out}) == 2  # PP 2: one digest per stage, its DP replicas agree


def test_moe_on_2_1_1_lowers_loss_and_repeats_bitwise(pool, tmp_path):
    moe = {"path": str(ROOT / "examples/models/tiny-moe.toml"), "overrides": {"vocab": 256, "seq": 32}}
    a = _run(pool, _config(tmp_path / "a", model=moe, plan={"source": "even", "ep": True}))
    val = a[0]["final_val_loss"]
    assert val < math.log(256) - 1.0, f"MoE validation loss {val:.3f} not well below ln 256"
    assert len({r["digest"] for r in a}) == 4  # each EP rank holds different experts
    b = _run(pool, _config(tmp_path / "b", model=moe, plan={"source": "even", "ep": True}))
    assert [r["losses"] for r in b] == [r["losses"] for r in a]
    assert [r["digest"] for r in b] == [r["digest"] for r in a]
    ga = [x["grad_norm"] for x in read_metrics(tmp_path / "a" / "metrics.jsonl")]
    assert ga == [x["grad_norm"] for x in read_metrics(tmp_path / "b" / "metrics.jsonl")]
    # no pipeline: no rank ever blocks in a pipeline receive
    assert all(x["rank_bubble_s"] == [0.0] * 4 for x in read_metrics(tmp_path / "a" / "metrics.jsonl"))


def test_clock_attributes_idle_time_to_what_the_chip_waited_for():
    """hal.emulation.timed: a completion that moves the timeline forward counts the chip's idle time by the kind
    of op (a fake clock: nothing sleeps); the Python process group wrappers tag send/recv as p2p."""
    from types import SimpleNamespace

    from hal.emulation.timed import Speeds, VirtualClock, timed, watch_process_group_class
    t = [0.0]
    clock = VirtualClock("x", Speeds(1e9, 1e12, "test"), now=lambda: t[0],
                         sleep=lambda d: t.__setitem__(0, t[0] + d))

    def work():
        fut = torch.futures.Future()
        return fut, SimpleNamespace(get_future=lambda: fut)
    clock.charge(1e9, 0)  # 1 s of compute: the device is busy until t = 1
    f1, w1 = work()
    clock.issued([w1], "p2p")
    t[0] = 3.0
    f1.set_result(None)  # the neighbour's data arrives at t = 3: idle 1 -> 3
    assert clock.device_time() == 3.0
    clock.charge(1e9, 0)  # device until 4
    f2, w2 = work()
    clock.issued([w2], "collective")
    f2.set_result(None)  # completes at t = 3, before the device got there: no idle time
    t[0] = 5.5
    f3, w3 = work()
    clock.issued([w3])
    t[0] = 6.0
    f3.set_result(None)  # an all_reduce done at t = 6: idle 4 -> 6
    clock.sync()
    st = clock.stats()
    assert st["busy_s"] == pytest.approx(2.0)
    assert st["wait_p2p_s"] == pytest.approx(2.0) and st["wait_collective_s"] == pytest.approx(2.0)

    class FakeGroup:  # a Python process group's methods, as watch_process_group_class wraps them
        def recv(self, tensors, src, tag):
            return w4

        def allreduce(self, tensors, opts=None):
            return w5
    watch_process_group_class(FakeGroup)
    f4, w4 = work()
    f5, w5 = work()
    with timed(clock):
        FakeGroup().recv([], 0, 0)
        FakeGroup().allreduce([])
    assert [k for _, _, k in clock._pending] == ["p2p", "collective"]


def test_split_step():
    sp = split_step(2.0, 1.0, 0.5, 0.25)
    assert sp["compute_share"] == 0.5 and sp["bubble_share"] == 0.25 and sp["comm_share"] == 0.125
    assert sp["other_s"] == pytest.approx(0.25)
    assert split_step(1.0, 1.5, None, None) == {"compute_s": 1.0, "bubble_s": None, "comm_s": None, "other_s": None,
                                                "compute_share": 1.0, "bubble_share": None, "comm_share": None}


def test_timed_split_bubble_with_pipeline_none_without(pool, tmp_path):
    """Timed emulation (chips EMULATED at their catalog speeds / time scale): a 2-stage pipeline
    (cuda ranks 0,1 | kunlun 2, ascend 3, 2 micro-batches) idles every rank at the stage boundary;
    pure DP over the 4 ranks has no p2p op at all, and waits in its gradient all_reduce."""
    short = {"steps": 6, "log": {"dir": "", "val_interval": 0, "val_batches": 1, "plots": False}}

    def cfg(name, plan):
        c = _config(tmp_path / name, plan=plan, **{k: v for k, v in short.items() if k != "log"})
        c["log"] = {**short["log"], "dir": str(tmp_path / name)}
        return c
    pool.run(_split_cases.run_timed, cfg("pp", {"source": "even", "pp": 2, "num_microbatches": 2}), "4e4",
             timeout=240)
    pool.run(_split_cases.run_timed, cfg("dp", {"source": "even"}), "4e4", timeout=240)
    pp = json.loads((tmp_path / "pp" / "summary.json").read_text())
    dp = json.loads((tmp_path / "dp" / "summary.json").read_text())
    assert pp["timed_emulation"] is True and dp["timed_emulation"] is True
    assert "virtual timeline" in pp["split_measure"]
    # every rank idles at the stage boundary; the fast stage (cuda) waits for the slower one most
    pp_recs = read_metrics(tmp_path / "pp" / "metrics.jsonl")
    bubble = pp["rank_bubble_share_median"]
    assert all(sum(x["rank_bubble_s"][i] for x in pp_recs) > 0 for i in range(4)), [x["rank_bubble_s"] for x in pp_recs]
    assert min(bubble[:2]) > 0.1 and min(bubble[:2]) > max(bubble[2:]), bubble
    assert all(x["rank_bubble_s"] == [0.0] * 4 for x in read_metrics(tmp_path / "dp" / "metrics.jsonl"))
    assert all(c > 0 for c in dp["rank_comm_s_median"]), dp["rank_comm_s_median"]
    for name in ("pp", "dp"):  # the parts are disjoint spans of the chip's timeline: they fit in the steps
        recs = read_metrics(tmp_path / name / "metrics.jsonl")  # (up to the host's sleep/wake-up jitter)
        for i in range(4):
            parts = sum(x["rank_compute_s"][i] + x["rank_comm_s"][i] + x["rank_bubble_s"][i] for x in recs)
            step = sum(x["rank_step_s"][i] for x in recs)
            assert parts <= step * 1.1, (name, i, parts, step)
