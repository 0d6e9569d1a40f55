"""Interleaved 1F1B memory in the planner (issue 25): torch's ScheduleInterleaved1F1B order reproduced
(schedule.interleaved_rank_order equals torch 2.13's own for several p, v, M), the peak activations per
rank group counted on that order (layout.interleaved_in_flight, equal chunks in closed form, uneven
chunks replayed), and a layout whose later stage does not fit torch's count refused. In this process,
no workers, well under 2 s.
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
from hal.strategies.planner.cost import replica_cost
from hal.strategies.planner.layout import in_flight, interleaved_in_flight
from hal.strategies.planner.simulate import simulate
from hal.strategies.schedule import interleaved_rank_order, interleaved_warmup

MID = ModelConfig(name="mid", layers=16, hidden=2048, heads=16, ffn=5632, vocab=32000, seq=1024)
CASES = [(2, 2, 2), (2, 2, 6), (3, 2, 3), (4, 2, 8), (4, 3, 4), (4, 4, 12), (4, 2, 2), (8, 4, 16), (16, 8, 32),
         (16, 8, 16), (16, 2, 48)]


def _torch_order(p: int, v: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    """torch's own: ScheduleInterleaved1F1B._calculate_single_rank_operations reads only these four
    attributes (set in its __init__ as here), so it runs on a namespace (no process group)."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    ns = SimpleNamespace(pp_group_size=p, n_local_stages=v, _n_microbatches=m,
                         microbatches_per_round=m // max(1, m // p))
    return [(a.computation_type.value, a.stage_index, a.microbatch_index)
            for a in schedules.ScheduleInterleaved1F1B._calculate_single_rank_operations(ns, rank) if a is not None]


def _replayed_peak(p: int, v: int, m: int, rank: int, chunks: list[int]) -> float:
    """Layer-micro-batches alive at the peak along torch's order, over the rank group's layers."""
    live = peak = 0
    for kind, stage, _ in _torch_order(p, v, m, rank):
        live += chunks[stage // p] * (1 if kind == "F" else -1)
        peak = max(peak, live)
    return peak / sum(chunks)


@pytest.mark.parametrize("p,v,m", CASES)
def test_interleaved_order_is_torchs(p, v, m):
    for rank in range(p):
        ours = interleaved_rank_order(rank, p, v, m)
        assert ours == _torch_order(p, v, m, rank), (p, v, m, rank)
        stages = [c * p + rank for c in range(v)]
        assert sorted(ours) == sorted((k, s, j) for k in "FB" for s in stages for j in range(m))
    with pytest.raises(ValueError, match="multiple of its rounds"):
        interleaved_rank_order(0, 4, 2, 10 + 1)       # torch: M % max(1, M // p) must be 0


def test_interleaved_peak_is_counted_on_torchs_order():
    for p, v, m in CASES:
        for s in range(p):
            # equal chunks: the closed form min(W + 1, M v) / v is the replayed peak
            assert interleaved_in_flight(m, p, s, v) == pytest.approx(_replayed_peak(p, v, m, s, [1] * v))
            assert in_flight(m, p, s, v, "Interleaved1F1B") == interleaved_in_flight(m, p, s, v)
            # uneven chunks (an embedding-only first chunk; sim_chain's first-larger cut) are replayed
            for chunks in ([0] + [2] * (v - 1), [3] + [2] * (v - 1)):
                assert interleaved_in_flight(m, p, s, v, tuple(chunks)) == \
                    pytest.approx(_replayed_peak(p, v, m, s, chunks))
    # the fixed under-count: the last rank group keeps (v - 1) p + 1 chunks, not 1 + 1/v stages
    p, v, m = 16, 8, 32
    assert interleaved_warmup(p - 1, p, v, m) == (v - 1) * p
    assert in_flight(m, p, p - 1, v, "Interleaved1F1B") == ((v - 1) * p + 1) / v > 1 + 1 / v
    assert in_flight(m, p, 0, v, "Interleaved1F1B") == ((v + 1) * p - 1) / v
    # Llama 3's embedding-only first chunk (one layer per chunk): rank 0 keeps fewer layers alive
    assert interleaved_in_flight(m, p, 0, v, (0,) + (1,) * 7) * 7 < interleaved_in_flight(m, p, 0, v) * 8
    # Llama 3's tunable N: torch's own N by default; a smaller N keeps fewer chunks (closed form = replay)
    assert interleaved_in_flight(m, p, 1, v, per_round=16) == interleaved_in_flight(m, p, 1, v)
    for n in (4, 8, 12):
        peak = interleaved_in_flight(m, p, 1, v, per_round=n)
        assert peak == ((v - 1) * n + 2 * (p - 2) + 1) / v < interleaved_in_flight(m, p, 1, v)
        live = most = 0
        for kind, _, _ in interleaved_rank_order(1, p, v, m, per_round=n):
            live += 1 if kind == "F" else -1
            most = max(most, live)
        assert most / v == peak


def test_a_layout_whose_later_stage_does_not_fit_is_refused():
    spec = '[[sub_clusters]]\nname = "h"\nchip = "cuda"\nmodel = "H100"\nnodes = 1\nranks_per_node = 8\n'
    facts = [chip_facts(sc) for sc in Topology.from_spec(parse_cluster_spec(spec)).sub_clusters]
    model = ModelFacts(MID)
    cands = [c for c in S.mixed_candidates(facts, model, 32) if c.layout.schedule == "Interleaved1F1B"
             and len(c.layout.stages) == 4 and c.layout.m == 8]
    assert cands
    shape = cands[0].layout
    p, m, v, last = 4, shape.m, shape.virtual, 3
    (a, b), groups = shape.stages[last]
    g = groups[0]
    now = in_flight(m, p, last, v, "Interleaved1F1B")
    assert now == ((v - 1) * p + 1) / v and v == 2        # 5/2 stage micro-batches, not 1 + 1/2

    def mem(alive: float) -> float:
        return replica_cost(model, g.facts, g.tp, b - a, False, True, g.mb, False, shape.zero, g.count, alive).memory
    old, new = mem(1 + 1 / v), mem(now)
    assert new > old
    # the last stage's usable memory between the two figures: it fitted under the old count, not torch's
    small = dataclasses.replace(g.facts, memory=(old + new) / 2)
    tight = dataclasses.replace(shape, recompute=[False] * p,
                                stages=shape.stages[:last] + [((a, b), [dataclasses.replace(x, facts=small)
                                                                         for x in groups])])
    sim = simulate(S.materialize(tight, {r: 0 for r in range(8)}), model)
    over = {r.stage for r in sim.ranks if r.memory_bytes > r.capacity_bytes}
    assert not sim.fits and over == {last}, over         # the first stage fits, the last does not
    assert not S.estimate(tight, model, uniform=True)[1]  # the search's closed form refuses it too


def test_interleaved_step_is_replayed_on_torchs_order():
    """The step of an Interleaved1F1B layout is a replay of torch's order (sim_chain.ChainPass): every rank
    group runs F and B of each of its v stages in interleaved_rank_order's order, each chunk its share of
    the group's forward / backward; with cheap sends it lands within a few percent of the closed form
    (1F1B less (1 - 1/v) of the fill and drain), and never under the group's own work."""
    import importlib
    sim_mod = importlib.import_module("hal.strategies.planner.simulate")
    from hal.strategies.planner import sim_chain
    from hal.strategies.planner.sim_costs import stage_costs
    spec = '[[sub_clusters]]\nname = "h"\nchip = "cuda"\nmodel = "H100"\nnodes = 4\nranks_per_node = 8\n'
    facts = [chip_facts(sc) for sc in Topology.from_spec(parse_cluster_spec(spec)).sub_clusters]
    model = ModelFacts(MID)
    cands = [c for c in S.mixed_candidates(facts, model, 64) if c.layout.schedule == "Interleaved1F1B"]
    picked = {}
    for c in cands:      # one layout per (p, M, v)
        picked.setdefault((len(c.layout.stages), c.layout.m, c.layout.virtual), c.layout)
    assert len(picked) >= 4, sorted(picked)

    def closed_form(lay):
        real = sim_chain.ChainPass.__init__

        def refuse(self, *a, **k):
            if k.get("interleaved"):
                raise ValueError("closed form asked for")
            real(self, *a, **k)
        sim_chain.ChainPass.__init__ = refuse
        try:
            return sim_mod.simulate(lay, model)
        finally:
            sim_chain.ChainPass.__init__ = real

    for (p, m, v), shape in sorted(picked.items())[:6]:
        lay = S.materialize(shape, {r: r // 8 for r in range(32)})
        sim = sim_mod.simulate(lay, model, trace=True)
        assert any("Interleaved1F1B: torch's order replayed" in n for n in sim.notes), sim.notes
        for s in range(p):      # replica 0 of each rank group: its actions in torch's order
            ev = sorted((e for e in sim.trace if e["pid"] == s and e["tid"] == 0 and "@" in e["name"]),
                        key=lambda e: e["ts"])
            got = [(e["name"][0], int(e["name"].split("@")[1]), int(e["name"][1:].split("@")[0])) for e in ev]
            assert got == interleaved_rank_order(s, p, v, m), (p, m, v, s)
        costs = stage_costs(lay, model)
        work = max(m * (c.fwd + c.bwd) for row in costs for c in row)
        old = closed_form(lay)
        assert not any("order replayed" in n for n in old.notes)
        assert sim.step_time_s >= work
        assert sim.step_time_s == pytest.approx(old.step_time_s, rel=0.06), (p, m, v)
