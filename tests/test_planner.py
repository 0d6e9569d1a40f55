"""The planner: figures and their sources, the cost model's arithmetic, the step simulator against
closed forms, the search against brute force and Plan.check, and `hal plan` / `hal simulate`.
Single process, no torch.distributed: pure arithmetic over plans."""
from __future__ import annotations

import dataclasses

import json

import pytest

from hal.core.cluster import parse_cluster_spec
from hal.core.topology import Topology
from hal.strategies.models import ModelConfig
from hal.strategies.plan import Plan
from hal.strategies.planner import ModelFacts, chip_facts, search, simulate
from hal.strategies.planner import plan_search as S
from hal.strategies.planner.sim_costs import stage_costs
from hal.strategies.planner.search_shapes import share_rows
from hal.strategies.planner.convert import from_plan, to_plan
from hal.strategies.planner.cost import replica_cost
from hal.strategies.planner.simulate import Layout, RepSpec, StageSpec

SMALL = ModelConfig(name="small", layers=8, hidden=1024, heads=16, ffn=2816, vocab=32000, seq=1024)
SMALL_MOE = ModelConfig(name="small-moe", layers=4, hidden=1024, heads=16, ffn=1408, vocab=32000, seq=1024,
                        experts=8, top_k=2)


def _topo(*subs: tuple[str, str, str, int, int]) -> Topology:
    text = ""
    for name, chip, model, nodes, rpn in subs:
        text += (f'[[sub_clusters]]\nname = "{name}"\nchip = "{chip}"\nmodel = "{model}"\n'
                 f"nodes = {nodes}\nranks_per_node = {rpn}\n")
    return Topology.from_spec(parse_cluster_spec(text))


def _facts(topo):
    return [chip_facts(sc) for sc in topo.sub_clusters], {r: topo.node_of(r) for r in range(topo.world_size)}


# ---- figures ------------------------------------------------------------------------------------
def test_every_figure_has_a_source_and_defaults_say_so():
    facts, _ = _facts(_topo(("h", "cuda", "H100", 1, 8), ("a", "ascend", "910B2", 1, 8), ("k", "kunlun", "P800", 1, 8)))
    for f in facts:
        assert set(f.sources) == {"flops", "memory", "memory_bw", "intra_bw", "nic_bw", "host_copy_bw"}
    h, a, k = facts
    # the best sustained rate is the H100's efficiency matrix's best GEMM fraction x its peak
    assert h.flops == pytest.approx(h.matrix.best_fraction * 989.5e12) and "efficiency matrix" in h.sources["flops"]
    assert h.matrix.best_fraction < 0.9 and h.memory == pytest.approx(80e9 * 0.95 - 2e9)
    assert h.peak == pytest.approx(989.5e12)
    assert "assumed" in k.sources["flops"]            # the catalog has no P800 peak
    assert "assumed" in a.sources["memory_bw"]        # nor a 910B2 memory bandwidth
    assert a.sources["nic_bw"].startswith("topology: default")


def test_measured_matrix_replaces_catalog(tmp_path):
    from hal.core.efficiency import BandwidthFigure, CollectiveFigure, EfficiencyMatrix, MatmulFigure
    from hal.strategies.planner.facts import load_matrices

    def mm(f):
        return MatmulFigure(dtype="bfloat16", m=4096, n=4096, k=4096, flops_per_s=f, seconds_median=1.0, repeats=3)

    def ar(nbytes, bus):
        return CollectiveFigure(collective="all_reduce", dtype="bfloat16", bytes=nbytes, world_size=8,
                                seconds_median=1.0, algbw=bus, busbw=bus, repeats=3)
    EfficiencyMatrix(chip="cuda", plugin="cuda", profile_model="H100", emulated=False, device="cuda:0", ccl="nccl",
                     torch_version="2.13", host="h", measured_at="2026-11-23T00:00:00Z",
                     matmul=[mm(6e14), mm(7e14)],
                     memory_bandwidth=[BandwidthFigure(bytes=2**30, bytes_per_s=3e12, seconds_median=1.0, repeats=3)],
                     collectives=[ar(2**20, 1e11), ar(2**30, 3e11)]).write(tmp_path / "h.json")
    topo = _topo(("h", "cuda", "H100", 1, 8))
    f = chip_facts(topo.sub_clusters[0], load_matrices(tmp_path))
    # the measured best GEMM replaces the catalog's; the chip's sustained share still applies (the perf level
    # times short runs, as the catalog's microbenchmarks do)
    assert f.flops == pytest.approx(7e14 * f.matrix.sustained) and f.sources["flops"].startswith("measured")
    assert f.matrix.sustained == catalog_sustained("cuda", "H100") < 1
    # a native perf run's sustained matmul replaces the catalog's share (hal.conformance perf.sustained_matmul)
    from hal.conformance.levels.perf import sustained_matmul
    from hal.core.efficiency import SustainedFigure
    acc = type("Acc", (), {"device": "cpu", "synchronize": staticmethod(lambda: None)})()
    run = sustained_matmul(acc, ["float32"], size=64, duration_s=0.05)
    kept = SustainedFigure(**run)                       # what the perf level writes validates
    assert kept.rounds >= 6 and 0 < kept.sustained <= 1 and kept.dtype == "float32"
    em = EfficiencyMatrix.model_validate_json((tmp_path / "h.json").read_text())
    em.sustained_matmul = SustainedFigure(dtype="bfloat16", m=8192, duration_s=20.0, rounds=900,
                                          seconds_short=0.0137, seconds_sustained=0.0152, sustained=0.0137 / 0.0152)
    em.write(tmp_path / "h.json")
    g = chip_facts(topo.sub_clusters[0], load_matrices(tmp_path))
    assert g.matrix.sustained == pytest.approx(0.0137 / 0.0152) and g.matrix.sources["sustained"].startswith("measured")
    assert g.flops == pytest.approx(7e14 * 0.0137 / 0.0152)
    assert f.memory_bw == 3e12 and 1e11 < f.intra_bw < 3e11 and f.sources["intra_bw"].startswith("measured")
    (tmp_path / "bad.json").write_text(json.dumps({"schema_version": "2.0", "chip": "x"}))
    with pytest.raises(ValueError, match="bad.json: not an efficiency matrix"):
        load_matrices(tmp_path)


# ---- cost model -----------------------------------------------------------------------------------
def test_state_memory_follows_zero_levels():
    facts, _ = _facts(_topo(("h", "cuda", "H100", 1, 8)))
    m = ModelFacts(SMALL)
    f = facts[0]
    base = dict(tp=1, n_layers=8, first=True, last=True, mb=1, recompute=True, dp=8, in_flight=1)
    mem = {z: replica_cost(m, f, base["tp"], 8, True, True, 1, True, z, 8, 1).memory for z in (0, 2, 3)}
    params = 8 * SMALL.layer_params() + 2 * SMALL.embed_params()
    # differences between levels are exactly the state bytes per parameter (REFERENCE.md), plus torch
    # DDP's separate gradient buckets (4 bytes per parameter) at zero 0
    assert mem[0] - mem[2] == pytest.approx(params * (16 + 4 - (2 + 14 / 8)), rel=1e-9)
    assert mem[2] - mem[3] == pytest.approx(params * ((2 + 14 / 8) - 16 / 8) - 2 * SMALL.layer_params() * 2, rel=1e-6)


def test_a_stage_keeps_its_in_flight_outputs_where_the_runtime_does():
    # apply_plan's pipelines keep each in-flight micro-batch's stage output until its backward (HeteroPipeline's
    # saved[m] = (x, out), torch's fwd_cache): b s h per chunk micro-batch alive, not on the loss's stage;
    # Megatron-LM and Llama 3 deallocate them (ModelFacts(keeps_stage_outputs=False), the published rows)
    from hal.strategies.planner.cost import _replica_cost
    from hal.strategies.planner.layout import outputs_alive
    f = _facts(_topo(("h", "cuda", "H100", 1, 8)))[0][0]
    keep, drop = ModelFacts(SMALL), ModelFacts(SMALL, keeps_stage_outputs=False)
    args = (f, 2, 4, True, False, 3, False, 0, 1, 4)
    base = _replica_cost(keep, *args).memory
    assert _replica_cost(keep, *args, outputs_alive=4).memory - base == pytest.approx(4 * keep.boundary_bytes() * 3)
    assert _replica_cost(drop, *args, outputs_alive=4).memory == pytest.approx(_replica_cost(drop, *args).memory)
    assert outputs_alive(4, 1, last=True) == 0 and outputs_alive(4, 1, last=False) == 4
    assert outputs_alive(2.5, 2, last=True) == 5            # interleaved: one per chunk micro-batch alive
    layout = _uniform_layout(f, 2, 4)
    mem = [row[0].memory for row in stage_costs(layout, keep)]
    mem_drop = [row[0].memory for row in stage_costs(layout, drop)]
    rows = layout.stages[0].reps[0].mb
    assert mem[0] - mem_drop[0] == pytest.approx(2 * keep.boundary_bytes() * rows)   # 1F1B: min(m, p - s) = 2
    assert mem[1] == pytest.approx(mem_drop[1])


def test_compute_time_is_flops_over_achieved_rate():
    facts, _ = _facts(_topo(("h", "cuda", "H100", 1, 8)))
    m = ModelFacts(SMALL)
    c1 = replica_cost(m, facts[0], 1, 1, False, False, 1, False, 0, 1, 1)
    c2 = replica_cost(m, facts[0], 1, 2, False, False, 1, False, 0, 1, 1)
    assert c2.fwd == pytest.approx(2 * c1.fwd)              # linear in layers
    c3 = replica_cost(m, facts[0], 1, 1, False, False, 3, False, 0, 1, 1)
    assert 3 * c1.fwd * 0.5 < c3.fwd < 3 * c1.fwd           # more rows: larger GEMMs, a higher fraction
    assert c1.bwd == pytest.approx(2 * c1.fwd)
    flops = SMALL.layer_forward_flops(SMALL.seq)
    assert c1.fwd >= flops / facts[0].flops                  # plus the memory-bound part, never less
    rc = replica_cost(m, facts[0], 1, 1, False, False, 1, True, 0, 1, 1)
    assert rc.bwd == pytest.approx(c1.bwd + c1.fwd)          # full recompute: one more forward
    # selective recompute: the attention core's forward again (its FLOPs at the matrix's attention
    # fraction) and the memory-bound ops (2 x activation bytes at the memory bandwidth), the memory of
    # no recompute (a fused kernel keeps no scores either way)
    sel = replica_cost(m, facts[0], 1, 1, False, False, 1, "selective", 0, 1, 1)
    attn = 4 * SMALL.seq * SMALL.hidden * SMALL.seq * (SMALL.seq + 1) / (2 * SMALL.seq) / \
        (facts[0].peak * facts[0].matrix.attention_rate)  # a fused causal core: s(s+1)/2 of the s^2 elements
    elementwise = 2 * m.act_bytes(1, False) / facts[0].memory_bw
    assert sel.bwd == pytest.approx(c1.bwd + attn + elementwise) and sel.memory == c1.memory


# ---- simulator -------------------------------------------------------------------------------------
def _uniform_layout(f, p: int, m: int, schedule: str = "1F1B") -> Layout:
    per = SMALL.layers // p
    stages = [StageSpec((s * per, (s + 1) * per), [RepSpec(f, (s,), 2)]) for s in range(p)]
    return Layout(stages=stages, m=m, schedule=schedule, node_of={r: 0 for r in range(8)})


def test_single_stage_step_is_m_times_work_plus_optimizer():
    facts, _ = _facts(_topo(("h", "cuda", "H100", 1, 8)))
    lay = _uniform_layout(facts[0], 1, 5)
    c = replica_cost(ModelFacts(SMALL), facts[0], 1, 8, True, True, 2, False, 0, 1, 5)
    res = simulate(lay, ModelFacts(SMALL))
    # micro-batches after the first add into the gradients the first one created (grad_acc)
    assert res.step_time_s == pytest.approx(5 * (c.fwd + c.bwd) + 4 * c.grad_acc + c.optimizer, rel=1e-9)
    assert res.bubble_share == pytest.approx(0.0, abs=1e-12)


def test_pipeline_bubble_matches_the_1f1b_formula_without_head():
    facts, _ = _facts(_topo(("h", "cuda", "H100", 1, 8)))
    cfg = SMALL.model_copy(update={"vocab": 2})         # negligible head: identical stages
    m = ModelFacts(cfg)
    for p, mb in ((2, 4), (4, 8), (4, 3)):
        per = cfg.layers // p
        lay = Layout(stages=[StageSpec((s * per, (s + 1) * per), [RepSpec(facts[0], (s,), 1)]) for s in range(p)],
                     m=mb, node_of={r: 0 for r in range(8)})
        res = simulate(lay, m)
        c = replica_cost(m, facts[0], 1, per, False, False, 1, False, 0, 1, 1)
        ideal = mb * (c.fwd + c.bwd)
        # (m + p - 1) slots of one stage's work plus the sends: the bubble is (p-1)/(m+p-1) of it
        slots = (mb + p - 1) * (c.fwd + c.bwd)
        assert slots * 0.999 <= res.step_time_s - c.optimizer <= slots * 1.2, (p, mb)
        assert res.step_time_s > ideal
        gp = simulate(Layout(stages=lay.stages, m=mb, schedule="GPipe", node_of=lay.node_of), m)
        assert gp.step_time_s == pytest.approx(res.step_time_s, rel=0.05)   # same makespan, more memory
        assert max(r.memory_bytes for r in gp.ranks) >= max(r.memory_bytes for r in res.ranks)


def test_reslicing_between_stages_of_different_dp_and_trace(tmp_path):
    facts, node_of = _facts(_topo(("h", "cuda", "H100", 1, 4), ("a", "ascend", "910B2", 1, 4)))
    h, a = facts
    lay = Layout(stages=[StageSpec((0, 5), [RepSpec(h, (0, 1), 5), RepSpec(h, (2, 3), 3)]),
                         StageSpec((5, 8), [RepSpec(a, (4,), 2), RepSpec(a, (5,), 2), RepSpec(a, (6,), 2),
                                            RepSpec(a, (7,), 2)])], m=3, node_of=node_of)
    res = simulate(lay, ModelFacts(SMALL), trace=True)
    assert res.step_time_s > 0 and len(res.ranks) == 8
    ops = [e for e in res.trace if e["name"][0] in "FB" and e["name"][1:].isdigit()]
    assert len(ops) == 2 * 3 * 6                          # F and B of 3 micro-batches on 6 replicas
    res.write_trace(tmp_path / "t.json")
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]


# ---- search -------------------------------------------------------------------------------------
def test_homogeneous_search_finds_the_brute_force_best():
    topo = _topo(("h", "cuda", "H100", 1, 8))
    facts, node_of = _facts(topo)
    m = ModelFacts(SMALL)
    res = search(facts, m, 32, node_of=node_of)
    every = S.mixed_candidates(facts, m, 32)
    assert len(every) > 10
    brute = min(simulate(S.materialize(c.layout, node_of), m).step_time_s for c in every)
    assert res.best.sim.step_time_s == pytest.approx(brute, rel=1e-9)
    assert res.efficiency == pytest.approx(1.0, rel=1e-9)     # one part: (a)'s reference is itself
    assert 0 < res.bound_efficiency < 1                        # (b): against every chip at its best rate


@pytest.mark.parametrize("cfg,batch", [(SMALL, 64), (SMALL_MOE, 64)])
def test_search_returns_plans_that_check_and_fit(cfg, batch):
    topo = _topo(("h", "cuda", "H100", 2, 8), ("a", "ascend", "910B2", 1, 8), ("k", "kunlun", "P800", 1, 4))
    facts, node_of = _facts(topo)
    m = ModelFacts(cfg)
    res = search(facts, m, batch, node_of=node_of)
    for cand in res.finalists + [res.even] + list(res.parts.values()):
        if cand is None:
            continue
        plan = to_plan(cand.layout, cfg.name)
        if cand in res.parts.values():
            continue          # a part alone covers only its own ranks
        plan.check(topo, cfg)
        assert cand.sim.fits
        assert plan.global_batch == batch
        again = simulate(from_plan(plan, facts, node_of), m)
        assert again.step_time_s == pytest.approx(cand.sim.step_time_s, rel=1e-9)
    assert res.efficiency >= (res.even_efficiency or 0)
    assert 0 < res.efficiency <= 1.05


def test_nothing_fits_is_a_typed_error():
    topo = _topo(("h", "cuda", "H100", 1, 2))
    facts, node_of = _facts(topo)
    huge = ModelConfig(name="huge", layers=4, hidden=65536, heads=64, ffn=262144, vocab=32000, seq=4096)
    with pytest.raises(S.PlanSearchError, match="no layout of huge fits this cluster .*usable memory per device: h"):
        search(facts, ModelFacts(huge), 8, node_of=node_of)


def test_split_layers_and_shares():
    assert S.split_layers(10, [1.0, 1.0], [0.0, 0.0]) == [5, 5]
    assert sum(S.split_layers(80, [1.0, 2.0, 2.0], [0.0, 0.0, 3.0])) == 80
    assert S.place_experts(8, [3.0, 1.0]) == [6, 2]
    rows = share_rows(10, [2, 2], [1.0, 3.0])    # fast kind takes ~3x the rows of the slow kind
    assert rows is not None
    (lo0, n0), (lo1, n1) = rows
    total = n0 * lo0 + (2 - n0) * (lo0 + 1) + n1 * lo1 + (2 - n1) * (lo1 + 1)
    assert total == 10 and lo0 > lo1


# ---- CLI ------------------------------------------------------------------------------------------
def test_hal_plan_and_simulate_cli(tmp_path, capsys):
    from hal.cli import main
    out, js, tr = tmp_path / "plan.toml", tmp_path / "f.json", tmp_path / "t.json"
    rc = main(["plan", "--cluster", "examples/clusters/laptop-2x2.toml", "--model", "examples/models/tiny.toml",
               "--batch", "8", "--out", str(out), "--json", str(js), "--trace", str(tr), "--quiet"])
    text = capsys.readouterr().out
    assert rc == 0, text
    data = json.loads(js.read_text())
    for key in ("step_time_s", "tokens_per_s", "efficiency", "even_efficiency", "bound_efficiency", "search_s"):
        assert key in data
    assert "(a) parts" in text and "(b) bound" in text and "Plan.even" in text and "source" in text
    plan = Plan.load(out)
    assert plan.global_batch == 8
    rc = main(["simulate", "--plan", str(out), "--cluster", "examples/clusters/laptop-2x2.toml",
               "--model", "examples/models/tiny.toml"])
    assert rc == 0
    assert f"{data['step_time_s']:.3f} s" in capsys.readouterr().out


@pytest.mark.parametrize("argv,needle", [
    (["--model", "nosuch.toml", "--cluster", "examples/clusters/laptop-2x2.toml"], "--model nosuch.toml: no such file"),
    (["--model", "examples/models/tiny.toml", "--cluster", "nosuch.toml"], "--cluster nosuch.toml: no such file"),
    (["--model", "examples/models/tiny.toml", "--cluster", "examples/clusters/laptop-2x2.toml", "--batch", "0"],
     "--batch 0: must be >= 1"),
    (["--model", "examples/models/tiny.toml", "--cluster", "examples/clusters/laptop-2x2.toml", "--out",
      "/nonexistent-dir/p.toml"], "directory /nonexistent-dir does not exist"),
])
def test_hal_plan_bad_input_is_one_line_exit_2(argv, needle, capsys):
    from hal.cli import main
    assert main(["plan"] + argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_hal_plan_only_plans_the_named_sub_clusters_and_says_when_one_alone_is_faster(capsys):
    from types import SimpleNamespace

    from hal.cli import main
    from hal.core.cluster import ClusterSpecError, load_cluster_spec
    from hal.strategies.planner.report import faster_part_lines
    spec = load_cluster_spec("examples/clusters/laptop-2x2.toml")
    sub = spec.subset(["ascend"])          # colocated with the dropped cuda part: gets its node back
    assert [s.name for s in sub.sub_clusters] == ["ascend"] and not sub.sub_clusters[0].colocate
    assert sub.world_size == 2 and sub.assignment(0).chip == "ascend" and sub.num_nodes == 1
    assert spec.subset(["ascend", "cuda"]).sub_clusters == spec.sub_clusters      # spec order kept
    with pytest.raises(ClusterSpecError, match=r"\['gpu'\] not in this cluster; sub-clusters: \['cuda', 'ascend'\]"):
        spec.subset(["gpu"])
    rc = main(["plan", "--cluster", "examples/clusters/laptop-2x2.toml", "--model", "examples/models/tiny.toml",
               "--batch", "8", "--only", "cuda", "--quiet"])
    text = capsys.readouterr().out
    assert rc == 0 and "2 ranks, 2 x H100 (cuda)" in text and "ascend" not in text.split("figures")[0]
    assert main(["plan", "--cluster", "examples/clusters/laptop-2x2.toml", "--model", "examples/models/tiny.toml",
                 "--only", "gpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--only: " in err[0] and "['gpu'] not in this cluster" in err[0]

    def part(tps):
        return SimpleNamespace(sim=SimpleNamespace(tokens_per_s=tps))
    res = SimpleNamespace(best=part(100.0), parts={"h": part(120.0), "a": part(30.0), "k": None})
    (line,) = faster_part_lines(res)
    assert "sub-cluster h alone is predicted faster" in line and "x1.20" in line and "--only h" in line
    assert faster_part_lines(SimpleNamespace(best=part(130.0), parts=res.parts)) == []


# ---- published-run mechanisms (issue 25) ----------------------------------------------------------
def catalog_sustained(chip: str, model: str) -> float:
    from hal.core import catalog
    return catalog.matrix(chip, model).sustained


def test_gemm_curve_is_capped_at_the_measured_maximum_and_scaled_to_the_sustained_rate():
    from hal.core import catalog
    mx = catalog.matrix("cuda", "H100")        # MAMF: 80.1% at its best shape, the maximum of its sweep
    # the H100's power cap: a sustained run keeps 0.883 of the first round's rate (napkin-math-gpu's samples)
    assert mx.sustained == pytest.approx(1.3646 / 1.5454, abs=1e-3) and mx.gemm_max == pytest.approx(0.801)
    best = 0.801 * mx.sustained
    assert mx.best_fraction == pytest.approx(best)
    assert mx.gemm_fraction(8192, 53248, 16384) == pytest.approx(best)          # the curve alone: 0.839
    h = mx.gemm_half_dim
    small = mx.gemm_peak * (256 / (256 + h)) ** 3 * mx.sustained
    assert mx.gemm_fraction(256, 256, 256) == pytest.approx(small) and small < best    # below the cap: the curve
    assert mx.attention_rate == pytest.approx(mx.attention * mx.sustained)
    # no throttling seen on the A100 (flat rounds); a chip without a measurement keeps its short-run rates
    assert catalog.matrix("cuda", "A100").sustained == pytest.approx(0.993)
    assert catalog.matrix("ascend").sustained == 1.0
    with pytest.raises(ValueError, match="sustained = 1.5 is outside"):
        dataclasses.replace(mx, sustained=1.5)


def test_megatron_p2p_charges_the_senders_stream_and_the_receivers_gather():
    from hal.strategies.planner.cost import gather_time, p2p_time
    f = _facts(_topo(("h", "cuda", "H100", 2, 8)))[0][0]
    plain, sync = ModelFacts(SMALL), ModelFacts(SMALL, megatron_p2p=True)
    tp, mb = 4, 2
    nbytes = plain.boundary_bytes() * mb / tp                 # scatter/gather: 1/t of the boundary per TP rank
    send = p2p_time(nbytes, f, f, same_node=False)
    gathered = gather_time(nbytes * tp, tp, f.intra_bw, f.link_latency)
    for first, last, df, db in ((True, False, send, gathered), (False, False, send + gathered, send + gathered),
                                (False, True, gathered, send)):
        a = replica_cost(plain, f, tp, 2, first, last, mb, False, 0, 1, 1)
        b = replica_cost(sync, f, tp, 2, first, last, mb, False, 0, 1, 1)
        assert b.fwd - a.fwd == pytest.approx(df) and b.bwd - a.bwd == pytest.approx(db)
    sp = ModelFacts(SMALL, megatron_p2p=True, sequence_parallel=True)   # SP: the shard is sent, nothing gathered
    a = replica_cost(ModelFacts(SMALL, sequence_parallel=True), f, tp, 2, False, False, mb, False, 0, 1, 1)
    assert replica_cost(sp, f, tp, 2, False, False, mb, False, 0, 1, 1).fwd - a.fwd == pytest.approx(send)
