"""The zero-bubble schedule in the planner (issue 25 item 2): torch's ZBVZeroBubble order reproduced
(schedule.zbv_rank_order equals torch 2.13's own for several p, M), its peak activations counted on
that order, the search proposing it where TorchPipeline can run it (equal chains, 2 stages per rank
group in a V), the simulator replaying that order with F / I / W each at its own cost, `hal plan
--schedule ZBVZeroBubble`, plan auto's per-chip dtype and schedule, and a ZBV plan from the search run
by apply_plan / TorchPipeline on emulated chips matching the single-process model.

Everything but the last test runs in this process (no workers); the last reuses the 6-rank pool the
other pipeline modules share (tests/conftest.py shared_pools, cuda:3 + kunlun:2 + ascend:1, EMULATED).
"""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from hal.core.cluster import parse_cluster_spec
from hal.core.topology import Topology
from hal.strategies.models import ModelConfig
from hal.strategies.planner import ModelFacts, chip_facts
from hal.strategies.planner import plan_search as S
from hal.strategies.planner.convert import from_plan, to_plan
from hal.strategies.planner.layout import in_flight, zbv_in_flight
from hal.strategies.planner.simulate import simulate
from hal.strategies.schedule import zbv_rank_order, zbv_stage_of

MID = ModelConfig(name="mid", layers=16, hidden=2048, heads=16, ffn=5632, vocab=32000, seq=1024)
TINY = ModelConfig(name="tiny", layers=4, hidden=32, heads=4, ffn=64, vocab=64, seq=16)  # tests/_pp_cases.py's


def _topo(*subs) -> Topology:
    text = "".join(f'[[sub_clusters]]\nname = "{n}"\nchip = "{c}"\nmodel = "{m}"\nnodes = 1\nranks_per_node = {k}\n'
                   for n, c, m, k in subs)
    return Topology.from_spec(parse_cluster_spec(text))


def _torch_order(p: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    """torch's own: ScheduleZBVZeroBubble._calculate_single_rank_operations reads only these three
    attributes, so it runs on a namespace (no process group)."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    if not hasattr(schedules, "ScheduleZBVZeroBubble"):
        pytest.skip("this torch has no ScheduleZBVZeroBubble (added in 2.6)")
    ns = SimpleNamespace(pp_group_size=p, num_stages=2 * p, _n_microbatches=m)
    return [(a.computation_type.value, a.stage_index, a.microbatch_index)
            for a in schedules.ScheduleZBVZeroBubble._calculate_single_rank_operations(ns, rank) if a is not None]


@pytest.mark.parametrize("p,m", [(1, 1), (2, 2), (2, 5), (3, 4), (4, 8), (4, 3), (8, 16), (8, 40)])
def test_zbv_order_is_torchs(p, m):
    for rank in range(p):
        ours = zbv_rank_order(rank, p, m)
        assert ours == _torch_order(p, m, rank), (p, m, rank)
        # every micro-batch's F, I and W once on each of the rank's two stages (the V)
        stages = {zbv_stage_of(rank, 0, p), zbv_stage_of(rank, 1, p)}
        assert sorted(ours) == sorted((k, s, j) for k in "FIW" for s in stages for j in range(m))


def test_zbv_peak_activations_counted_on_the_order():
    for p in (1, 2, 3, 4, 8):
        for m in range(1, 4 * p + 2):
            for s in range(p):
                live = peak = 0
                for kind, _, _ in zbv_rank_order(s, p, m):     # a chunk (half the layers) lives from F to W
                    live += {"F": 1, "W": -1}.get(kind, 0)
                    peak = max(peak, live)
                assert zbv_in_flight(m, p, s) == peak / 2 == in_flight(m, p, s, 2, "ZBVZeroBubble")
            # the paper's claim (Qi et al. 2023, section 6): the peak is 1F1B's (its first stage's)
            assert max(zbv_in_flight(m, p, s) for s in range(p)) == in_flight(m, p, 0) == min(m, p)


def _mid_zbv():
    topo = _topo(("h", "cuda", "H100", 8))
    facts, node_of = [chip_facts(sc) for sc in topo.sub_clusters], {r: 0 for r in range(8)}
    m = ModelFacts(MID)
    cands = [c for c in S.mixed_candidates(facts, m, 32) if c.layout.schedule == "ZBVZeroBubble"]
    return topo, facts, node_of, m, cands


def test_search_proposes_zbv_and_the_simulator_replays_torchs_order():
    topo, facts, node_of, m, cands = _mid_zbv()
    assert cands and all(c.layout.virtual == 2 and len(c.layout.stages) > 1 for c in cands)
    c = min(cands, key=lambda c: c.estimate_s)
    layout = S.materialize(c.layout, node_of)
    assert layout.schedule == "ZBVZeroBubble"
    plan = to_plan(layout, MID.name)
    plan.check(topo, MID)           # 2p stages in a V: plan.py's rule, which is torch's
    p = len(layout.stages)
    assert [plan.stages[k].replicas[0].ranks for k in range(2 * p)] == \
        [list(layout.stages[min(k, 2 * p - 1 - k)].reps[0].ranks) for k in range(2 * p)]
    sim = simulate(layout, m, trace=True)
    for s in range(p):              # each rank group ran torch's order, F / I / W each for its own time
        ev = sorted((e for e in sim.trace if e["pid"] == s and e["tid"] == 0 and e["name"] != "dp_reduce"),
                    key=lambda e: e["ts"])
        assert [e["name"] for e in ev] == [f"{k}{j}@{st}" for k, st, j in zbv_rank_order(s, p, layout.m)]
        w = {e["dur"] for e in ev if e["name"].startswith("W")}
        i = {e["dur"] for e in ev if e["name"].startswith("I")}
        assert min(w) > 0 and max(w) < max(i)      # W: the weight GEMMs; I: the rest (attention core too)
    assert from_plan(plan, facts, node_of).schedule == "ZBVZeroBubble"
    assert simulate(from_plan(plan, facts, node_of), m).step_time_s == pytest.approx(sim.step_time_s, rel=1e-9)
    # against the same rank groups on 1F1B: shorter; and no shorter than its busiest group's compute
    plain = simulate(S.materialize(dataclasses.replace(c.layout, virtual=1, schedule="1F1B"), node_of), m)
    busiest = max(layout.m * (r.busy_s + r.comm_s) for r in sim.ranks) / layout.m
    assert busiest < sim.step_time_s < plain.step_time_s
    # the head and loss sit on rank group 0 (it holds stage 2p - 1): its memory counts them
    assert sim.ranks[0].memory_bytes > max(r.memory_bytes for r in sim.ranks if r.stage == p - 1)


def test_hal_plan_schedule_zbv_writes_a_zbv_plan(tmp_path, capsys):
    from hal.cli import main
    out = tmp_path / "plan.json"
    rc = main(["plan", "--cluster", "examples/clusters/laptop-2x2.toml", "--model", "examples/models/tiny.toml",
               "--schedule", "ZBVZeroBubble", "--out", str(out), "--quiet"])
    text = capsys.readouterr().out
    assert rc == 0 and "ZBVZeroBubble" in text and "torch's F / I / W order replayed" in text, text
    from hal.strategies.plan import Plan
    assert Plan.load(out).schedule == "ZBVZeroBubble"


def test_plan_auto_prices_each_chip_at_its_charged_dtype_and_keeps_the_schedule(monkeypatch):
    from hal.emulation import timed
    from hal.trainer import autoplan
    topo = _topo(("h", "cuda", "H100", 2), ("a", "ascend", "910A", 2))
    # precision auto: bfloat16 on the H100, float16 on the 910A (it has no bfloat16); a chip-scoped
    # HAL_EMULATE_TIMED_DTYPE forces one chip only
    assert autoplan.charged_dtypes("auto", topo, {}) == {"h": "bfloat16", "a": "float16"}
    assert autoplan.charged_dtypes("auto", topo, {"HAL_EMULATE_TIMED_DTYPE": "cuda:float32"}) == \
        {"h": "float32", "a": "float16"}
    assert autoplan.charged_dtypes("fp32", topo, {"HAL_EMULATE_TIMED_DTYPE": "float32=bfloat16"}) == \
        {"h": "bfloat16", "a": "bfloat16"}
    seen = {}

    def fake_search(facts, model, batch, **kw):      # the real search's ZBV candidate, on the facts given
        seen.update({f.name: f.flops for f in facts})
        cands = [c for c in S.mixed_candidates(facts, model, batch) if c.layout.schedule == "ZBVZeroBubble"]
        best = min(cands, key=lambda c: c.estimate_s)
        best.layout = S.materialize(best.layout, kw.get("node_of"))
        return SimpleNamespace(best=best)

    monkeypatch.setenv("HAL_EMULATE_TIMED", "1")
    monkeypatch.delenv("HAL_EMULATE_TIMED_DTYPE", raising=False)
    monkeypatch.setattr(S, "search", fake_search)
    cfg = SimpleNamespace(train=SimpleNamespace(precision="auto"), global_batch=8, plan=SimpleNamespace(max_pp=32))
    plan = autoplan.auto_plan(cfg, topo, TINY, (1e-5, 1e9))
    scale = timed.time_scale()
    assert seen == {"h": timed.chip_speeds("cuda", "bfloat16", scale, model="H100").flops_per_s,
                    "a": timed.chip_speeds("ascend", "float16", scale, model="910A").flops_per_s}
    assert plan.schedule == "ZBVZeroBubble"
    plan.check(topo, TINY)


def _pool_facts():
    """The 6-rank pool's chips as the planner sees them, restricted to the cuda ranks 0, 1 and the
    kunlun ranks 3, 4 (the layout the other pipeline tests run their equal chains on)."""
    topo = _topo(("c", "cuda", "H100", 3), ("k", "kunlun", "P800", 2), ("a", "ascend", "910B2", 1))
    c, k, _ = [chip_facts(sc) for sc in topo.sub_clusters]
    return topo, [dataclasses.replace(c, ranks=(0, 1), ranks_per_node=2), dataclasses.replace(k, ranks=(3, 4))]


@pytest.mark.slow
def test_a_zbv_plan_from_the_search_trains_like_one_process(shared_pools):
    from . import _pp_cases as cases
    from .test_strategies_pp import EMULATE
    _, facts = _pool_facts()
    node_of = {r: 0 for r in range(6)}
    # the search's own steps (its mixed-stage generator, then finalists simulated) on ranks 0, 1, 3, 4:
    # S.search would also lay out even baselines over contiguous world ranks, which this subset is not
    model = ModelFacts(TINY)
    cands = [c for c in S.mixed_candidates(facts, model, 8) if c.layout.schedule == "ZBVZeroBubble"]
    best = S.finalize(cands, model, 8, node_of)[0]
    assert best.sim.fits
    plan = to_plan(best.layout, TINY.name)
    assert plan.schedule == "ZBVZeroBubble" and len(plan.stages) == 4     # 2 rank groups in a V
    assert [s.replicas[0].ranks for s in plan.stages] == [[0], [1], [1], [0]]
    pool = shared_pools.get(6, {"HAL_EMULATE": EMULATE})      # test_strategies_pp's pool, when it ran first
    pool.run(cases.init, "hetero", timeout=300)
    pj = plan.to_json()
    cases.check(pool.run(cases.train_plan, pj, runtime="torch", timeout=180), pj, "TorchPipeline")
