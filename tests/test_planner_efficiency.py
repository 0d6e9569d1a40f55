"""The planner's efficiency figures and memory headroom (issue 25): (b) is a true upper bound that no
plan exceeds; neither (a) nor (b) falls when a link or the memory gets better, all else equal; a
cluster whose parts cannot hold the model alone is planned and reported against (b); a plan never uses
more than the usable memory (capacity less the matrix's reserve and fragmentation), and the cluster
spec's `memory` per sub-cluster replaces the catalog's."""
from __future__ import annotations

import dataclasses

import pytest

from hal.core.cluster import ClusterSpecError, parse_cluster_spec
from hal.core.topology import Topology
from hal.strategies.models import ModelConfig
from hal.strategies.planner import ModelFacts, chip_facts, search
from hal.strategies.planner.facts import cluster_facts
from hal.strategies.planner.plan_search import bound_tokens_per_s

SMALL = ModelConfig(name="small", layers=8, hidden=1024, heads=16, ffn=2816, vocab=32000, seq=1024)
MID = ModelConfig(name="mid", layers=16, hidden=2048, heads=16, ffn=5632, vocab=32000, seq=1024)


def _spec_text(*subs) -> str:
    text = ""
    for name, chip, model, nodes, rpn, *extra in subs:
        text += (f'[[sub_clusters]]\nname = "{name}"\nchip = "{chip}"\nmodel = "{model}"\n'
                 f"nodes = {nodes}\nranks_per_node = {rpn}\n" + "".join(f"{e}\n" for e in extra))
    return text


def _facts(*subs, memory=None):
    topo = Topology.from_spec(parse_cluster_spec(_spec_text(*subs)))
    facts = [chip_facts(sc, memory=(memory or {}).get(sc.name)) for sc in topo.sub_clusters]
    return facts, {r: topo.node_of(r) for r in range(topo.world_size)}


MIXED = (("h", "cuda", "H100", 1, 4), ("a", "ascend", "910B2", 1, 4))
BATCH = 32


@pytest.fixture(scope="module")
def mixed():
    facts, node_of = _facts(*MIXED)
    m = ModelFacts(SMALL)
    return facts, node_of, m, search(facts, m, BATCH, node_of=node_of)


def test_no_plan_exceeds_the_upper_bound_and_plans_fit_usable_memory(mixed):
    facts, node_of, m, res = mixed
    bound = bound_tokens_per_s(facts, m)
    assert res.bound_tokens_per_s == bound
    cands = res.finalists + [c for c in res.parts.values() if c is not None]
    assert len(cands) > 3
    for c in cands:
        assert c.sim.tokens_per_s < bound                  # every op charged at most at the best rate
        for r in c.sim.ranks:                              # never over the usable memory
            assert r.memory_bytes <= r.capacity_bytes
    assert 0 < res.bound_efficiency < 1 and res.efficiency is not None and 0 < res.efficiency <= 1.05
    for f in facts:                                        # usable = capacity x 0.95 - 2 GB (the matrix)
        assert f.memory == pytest.approx(f.matrix.usable_memory(f.capacity)) and f.memory < f.capacity


def _better(facts, name, **change):
    return [dataclasses.replace(f, **change) if f.name == name else f for f in facts]


@pytest.mark.parametrize("change", [
    {"nic_bw": 4.0}, {"intra_bw": 4.0}, {"rail_bw": 4.0}, {"memory": 1.5}])
def test_efficiency_does_not_fall_when_a_link_or_the_memory_gets_better(mixed, change):
    facts, node_of, m, base = mixed
    key, factor = next(iter(change.items()))
    target = "a"                                            # the slower part's figure gets better
    old = next(getattr(f, key) or f.nic_bw for f in facts if f.name == target)
    better = search(_better(facts, target, **{key: old * factor}), m, BATCH, node_of=node_of)
    assert better.bound_tokens_per_s == base.bound_tokens_per_s      # (b)'s reference does not move
    assert better.bound_efficiency >= base.bound_efficiency * (1 - 1e-9)
    if key == "rail_bw":      # the parts alone use no rail: (a)'s reference does not move either
        assert better.efficiency >= base.efficiency * (1 - 1e-9)


def test_parts_that_cannot_hold_the_model_alone_are_pipelined_and_reported_against_the_bound():
    # 3 GB usable per device: neither 4-GPU part holds MID's ~1 B parameters' training state (16 GB)
    # alone, the 8 GPUs together do
    facts, node_of = _facts(("h", "cuda", "H100", 1, 4), ("g", "cuda", "A100", 1, 4),
                            memory={"h": 5.3e9, "g": 5.3e9})
    m = ModelFacts(MID)
    assert 4 * facts[0].memory < 16 * MID.num_params() < 8 * facts[0].memory
    res = search(facts, m, 32, node_of=node_of)
    assert all(c is None for c in res.parts.values())
    assert res.efficiency is None and 0 < res.bound_efficiency < 1
    assert res.best.sim.fits and len(res.best.layout.stages) >= 2
    assert {r.facts.name for st in res.best.layout.stages for r in st.reps} == {"h", "g"}


def test_spec_memory_per_sub_cluster_replaces_the_catalog(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(_spec_text(("small", "ascend", "910B4", 1, 8, 'memory = "32 GB"'),
                               ("big", "ascend", "910B2", 1, 8)))
    from hal.core.cluster import load_cluster_spec
    topo = Topology.from_spec(load_cluster_spec(path))
    small, big = cluster_facts(topo)
    assert small.capacity == 32e9 and small.sources["memory"].startswith("cluster spec")
    assert big.capacity == 64e9 and small.memory == pytest.approx(32e9 * 0.95 - 2e9)
    # the memory check before launch (and plan auto, through the same cluster_facts) holds each rank to
    # its sub-cluster's spec memory, not the catalog's 64 GB
    from hal.strategies.plan import Plan
    from hal.trainer.memory_fit import memory_per_rank
    ranks, by_name = memory_per_rank(Plan.even(topo, SMALL, 16), topo, SMALL, "bf16")
    caps = {r.sub_cluster: r.capacity_bytes for r in ranks}
    assert caps == {"small": pytest.approx(small.memory), "big": pytest.approx(big.memory)}
    assert by_name["small"].sources["memory"].startswith("cluster spec")
    assert parse_cluster_spec(_spec_text(("x", "cuda", "H100", 1, 8, "memory = 96e9"))).sub_clusters[0].memory == 96e9
    with pytest.raises(ClusterSpecError, match="memory"):
        parse_cluster_spec(_spec_text(("x", "cuda", "H100", 1, 8, 'memory = "lots"')))


@pytest.mark.parametrize("schedule", ["Interleaved1F1B", "ZBVZeroBubble"])
def test_interleaved_candidates_round_trip_through_plans(schedule):
    # 16 layers on 8 H100s: the search scores Interleaved1F1B (v = 2, 4, 8) and ZBVZeroBubble (v = 2
    # in a V) beside 1F1B; such a finalist becomes a plan torch's schedule runs (p v stages round-robin,
    # or 2p in a V) that checks, and reads back to the same prediction; its step is shorter than the
    # same shape's 1F1B
    from hal.strategies.planner import plan_search as S
    from hal.strategies.planner.convert import from_plan, to_plan
    from hal.strategies.planner.simulate import simulate
    topo = Topology.from_spec(parse_cluster_spec(_spec_text(("h", "cuda", "H100", 1, 8))))
    facts, node_of = [chip_facts(sc) for sc in topo.sub_clusters], {r: 0 for r in range(8)}
    m = ModelFacts(MID)
    cands = [c for c in S.mixed_candidates(facts, m, 32) if c.layout.virtual > 1 and c.layout.schedule == schedule]
    if schedule == "Interleaved1F1B":
        assert cands and {2, 4} <= {c.layout.virtual for c in cands} <= {2, 4, 8}
        from hal.strategies.planner.search_families import virtual_options
        assert virtual_options(2, 32, [8, 8]) == [1, 2, 4, 8] and virtual_options(2, 31, [8, 8]) == [1]
    else:
        assert cands and {c.layout.virtual for c in cands} == {2}
    c = min(cands, key=lambda c: c.estimate_s)
    layout = S.materialize(c.layout, node_of)
    plan = to_plan(layout, MID.name)
    assert plan.schedule == schedule and len(plan.stages) == len(layout.stages) * layout.virtual
    plan.check(topo, MID)
    sim = simulate(layout, m)
    assert simulate(from_plan(plan, facts, node_of), m).step_time_s == pytest.approx(sim.step_time_s, rel=1e-9)
    plain = simulate(S.materialize(dataclasses.replace(c.layout, virtual=1, schedule="1F1B"), node_of), m)
    assert sim.step_time_s < plain.step_time_s


def test_layouts_keep_their_recompute_kind_and_selective_saves_memory_only_with_unfused_attention():
    # a shape's "none" / "selective" / full reach the simulator as such (materialize once made them
    # bool(...): "none" and "selective" priced as full); selective costs less than full, more than none;
    # its memory equals none's with a fused core and is below it when the core keeps its scores
    from hal.strategies.planner import plan_search as S
    from hal.strategies.planner.cost import replica_cost
    from hal.strategies.planner.sim_costs import stage_costs
    facts, node_of = _facts(("h", "cuda", "H100", 1, 8))
    f = facts[0]
    stages = [((0, 8), [S.Group(f, 2, 1, None, 2)]), ((8, 16), [S.Group(f, 2, 1, None, 2)])]
    for kinds in (["none", "selective"], [False, True]):
        layout = S.materialize(S.Shape(stages, 4, 0, kinds), node_of)
        assert [st.recompute for st in layout.stages] == [{"none": False}.get(k, k) for k in kinds]
    bwd = [stage_costs(S.materialize(S.Shape(stages, 4, 0, [k, k]), node_of), ModelFacts(MID))[0][0].bwd
           for k in ("none", "selective", True)]
    assert bwd[0] < bwd[1] < bwd[2]
    for fused in (True, False):
        m = ModelFacts(MID, fused_attention=fused)
        mem = {k: replica_cost(m, f, 2, 8, True, False, 1, k, 0, 2, 2).memory for k in ("none", "selective")}
        assert (mem["selective"] == mem["none"]) if fused else (mem["selective"] < mem["none"])


def test_tp_overlap_hides_the_tp_collectives_under_the_gemms():
    # Megatron-Core's --tp-comm-overlap (ModelFacts(tp_overlap=True), used for published runs): only
    # the TP traffic a pass's GEMMs cannot cover is exposed (this small TP 4 block: part of it); without
    # the overlap (apply_plan) every collective adds to the pass
    from hal.strategies.planner.cost import replica_cost
    facts, _ = _facts(("h", "cuda", "H100", 1, 8))
    plain = replica_cost(ModelFacts(MID), facts[0], 4, 8, True, False, 2, False, 0, 2, 1)
    hidden = replica_cost(ModelFacts(MID, tp_overlap=True), facts[0], 4, 8, True, False, 2, False, 0, 2, 1)
    assert 0 < hidden.tp_comm < plain.tp_comm
    saved = plain.tp_comm - hidden.tp_comm
    assert hidden.fwd + hidden.bwd == pytest.approx(plain.fwd + plain.bwd - saved)
    assert hidden.fwd < plain.fwd and hidden.bwd < plain.bwd


def test_selective_recompute_recomputes_attention_only_with_the_same_gradients():
    # apply_plan hands a stage's `recompute` to StageModule: "selective" re-runs only the attention core
    # in backward (torch's selective activation checkpointing), "full" the whole block
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from hal.strategies.apply import StageModule
    from hal.strategies.models import build_model

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = {"attn": 0, "mm": 0}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if "scaled_dot_product" in name and "backward" not in name:
                self.n["attn"] += 1
            if name in ("mm", "addmm", "bmm"):
                self.n["mm"] += 1
            return func(*args, **(kwargs or {}))

    cfg = ModelConfig(name="t", layers=2, hidden=32, heads=4, ffn=64, vocab=64, seq=16)
    grads, seen = {}, {}
    torch.manual_seed(0)
    # build_model initialises every parameter (GPT(cfg) alone leaves torch.empty storage: garbage that
    # made this comparison depend on what earlier tests left in memory)
    stage = StageModule(build_model(cfg, seed=0), (0, 2), True, True)
    x = torch.randint(0, cfg.vocab, (2, cfg.seq))
    for kind in ("none", "selective", "full"):   # one stage, same weights and input, recompute switched
        stage.recompute = kind
        stage.zero_grad(set_to_none=True)
        stage(x).float().pow(2).mean().backward()
        grads[kind] = [p.grad.clone() for p in stage.parameters()]
        with Count() as c:                   # the ops a second pass runs (counted apart from the gradients)
            stage(x).float().pow(2).mean().backward()
        stage.zero_grad(set_to_none=True)
        seen[kind] = c.n
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(grads["none"], grads["selective"]))
    assert seen["none"]["attn"] == 2 and seen["selective"]["attn"] == 4 and seen["full"]["attn"] == 4
    assert seen["selective"]["mm"] == seen["none"]["mm"] < seen["full"]["mm"]     # no GEMM re-run


def test_moe_step_grows_by_the_router_and_dispatch_bytes_over_memory_bandwidth(monkeypatch):
    # Megatron's and hal.strategies.moe's MoE layer permutes every routed row to its expert, sorts the
    # received rows into local-expert order and back (EP, several local experts), un-permutes and sums
    # the k outputs of each token, and runs a fp32 softmax/top-k over the router logits: memory-bound
    # passes over these bytes, forward and again backward, at the chip's memory bandwidth
    from hal.strategies.planner import cost
    facts, _ = _facts(("h", "cuda", "H100", 1, 8))
    f = facts[0]
    moe = ModelConfig(name="moe", layers=4, hidden=1024, heads=16, ffn=2816, vocab=32000, seq=1024, experts=8,
                      top_k=2)
    layers, mb, ep = 4, 2, (4, f.intra_bw)
    T, k, E, B, h = 1024 * mb, 2, 8, 2, 1024           # 2 local experts of 8 over EP 4: the sort runs
    router = T * E * (B + 4 + 4) + T * k * (4 + 8)
    rows = 2 * k * T * h * B + (k + 1) * T * h * B + 2 * 2 * k * T * h * B
    want = layers * (router + rows) / f.memory_bw
    args = (f, 1, layers, True, False, mb, "none", 0, 8, 1)
    with_ = cost.replica_cost(ModelFacts(moe), *args, ep=ep, experts_local=2)
    monkeypatch.setattr(cost, "moe_dispatch_bytes", lambda *a: 0.0)
    without = cost.replica_cost(ModelFacts(moe), *args, ep=ep, experts_local=2)
    assert want > 0
    assert with_.fwd - without.fwd == pytest.approx(want, rel=1e-9)
    assert with_.bwd - without.bwd == pytest.approx(want, rel=1e-9)
    monkeypatch.undo()
    assert cost.moe_dispatch_bytes(ModelFacts(SMALL), mb, None, None) == 0.0      # dense: no such pass


def test_the_last_stage_pays_the_losss_fp32_vocabulary_passes_over_memory_bandwidth():
    # the loss's LOSS_COPIES fp32 s x vocab tensors (logits, log-softmax, their gradients; the ones the
    # memory term counts) are written and read once: half the bytes forward, half backward, only on the
    # stage with the head, and split over TP only where the runtime shards the vocabulary
    from hal.strategies.planner import cost
    facts, _ = _facts(("h", "cuda", "H100", 1, 8))
    f = facts[0]
    s, v, mb = SMALL.seq, SMALL.vocab, 2
    for vocab_parallel, tp in ((False, 1), (False, 2), (True, 2)):
        m = ModelFacts(SMALL, vocab_parallel=vocab_parallel)
        want = 2 * cost.LOSS_COPIES * 4 * s * v * mb / (tp if vocab_parallel else 1) / 2 / f.memory_bw
        assert cost.loss_bytes(m, tp, mb) / 2 / f.memory_bw == pytest.approx(want)
        last = cost._replica_cost(m, f, tp, 4, False, True, mb, "none", 0, 1, 1)
        mid = cost._replica_cost(m, f, tp, 4, False, False, mb, "none", 0, 1, 1)
        head = m.head_fwd_flops() * mb / (tp if vocab_parallel else 1)
        gemm = head / cost._rate(f, s * mb, v / (tp if vocab_parallel else 1), SMALL.hidden)
        assert last.fwd - mid.fwd == pytest.approx(gemm + want, rel=1e-9)
        assert last.bwd - mid.bwd == pytest.approx(2 * gemm + want, rel=1e-9)


def test_sliding_window_layers_charge_only_the_windows_share_of_a_fused_attention_core():
    # ModelConfig.sliding_window / layer_types (HF's names): a fused kernel that skips the tiles outside the
    # window does W(W+1)/2 + (S-W)W of the S^2 score elements the model FLOPs count on a windowed layer, a
    # causal one S(S+1)/2; the unfused core computes all of s x s, so it saves nothing; the rest of the
    # block is priced as before
    from hal.strategies.models.config import ModelConfigError
    from hal.strategies.models.gpt import Attention
    from hal.strategies.models.hf_map import HFConfigError, config_to_hf
    from hal.strategies.planner.cost import _block_seconds, attention_work_share
    windowed = MID.model_copy(update=dict(sliding_window=128, layer_types=("sliding_attention", "full_attention") * 8))
    windowed = ModelConfig(**windowed.model_dump())
    s, w = MID.seq, 128
    share, causal = (w * (w + 1) / 2 + (s - w) * w) / s ** 2, (s + 1) / (2 * s)
    assert windowed.windowed_layers() == 8 and attention_work_share(MID) == pytest.approx(causal)
    assert attention_work_share(windowed) == pytest.approx((8 * share + 8 * causal) / 16)
    f = _facts(("h", "cuda", "H100", 1, 8))[0][0]
    for fused in (True, False):
        full_s, full_a = _block_seconds(ModelFacts(MID, fused_attention=fused), f, 2, 1)
        win_s, win_a = _block_seconds(ModelFacts(windowed, fused_attention=fused), f, 2, 1)
        want = full_a * attention_work_share(windowed) / attention_work_share(MID) if fused else full_a
        assert win_a == pytest.approx(want) and full_s - win_s == pytest.approx(full_a - win_a)
    with pytest.raises(ModelConfigError, match="layer_types.*16 entries for layers = 8"):
        ModelConfig(**{**windowed.model_dump(), "layers": 8})
    with pytest.raises(ModelConfigError, match="sliding_window is not set"):
        ModelConfig(**{**windowed.model_dump(), "sliding_window": None})
    tiny = ModelConfig(name="t", layers=1, hidden=16, heads=2, ffn=32, vocab=8, seq=8, sliding_window=4)
    with pytest.raises(ModelConfigError, match="sliding_window = 4"):
        Attention(tiny)      # hal's decoder attends over the whole prefix: it refuses, never ignores, a window
    with pytest.raises(HFConfigError, match="sliding_window"):
        config_to_hf(tiny)


def test_a_fused_causal_core_is_charged_its_half_and_the_bound_still_holds():
    # FlashAttention's benchmarks rate a causal run on s(s+1)/2 of the s^2 score elements (the count the
    # matrix's `attention` fraction is measured on): the fused core costs that share of the 4 s h count at the
    # attention fraction; the unfused core computes and masks all of s x s (its two GEMMs at their fraction)
    from hal.strategies.planner.cost import _block_seconds
    f = _facts(("h", "cuda", "H100", 1, 8))[0][0]
    s, q = MID.seq, MID.hidden
    full = 4 * s * q * s / 2                                   # one sample's forward on one of 2 TP ranks
    fused = _block_seconds(ModelFacts(MID), f, 2, 1)[1]
    unfused = _block_seconds(ModelFacts(MID, fused_attention=False), f, 2, 1)[1]
    assert fused == pytest.approx(full * (s + 1) / (2 * s) / (f.peak * f.matrix.attention_rate))
    assert unfused == pytest.approx(full / (f.peak * f.matrix.gemm_fraction(s, s, q / MID.heads)))
    # per counted FLOP the fused causal core (0.5 / about 0.5 of the count) beats the best GEMM fraction (0.80):
    # an attention-bound model's plan outruns "all model FLOPs at the best rate", and (b) must price
    # attention's count at the fused rate to stay a bound
    long = ModelConfig(name="long", layers=2, hidden=512, heads=4, ffn=1408, vocab=1024, seq=65536)
    facts, node_of = _facts(("h", "cuda", "H100", 1, 1))
    m = ModelFacts(long)
    res = search(facts, m, 8, node_of=node_of)
    at_best = sum(x.size * x.flops for x in facts) * m.seq / m.step_flops_per_sample()
    assert at_best < res.best.sim.tokens_per_s, "the case no longer outruns its FLOPs at the best rate"
    assert res.best.sim.tokens_per_s < bound_tokens_per_s(facts, m) == res.bound_tokens_per_s
    unfused_m = ModelFacts(long, fused_attention=False)        # no saving: the bound is the count at the best rate
    assert bound_tokens_per_s(facts, unfused_m) == pytest.approx(at_best)
