"""The planner's memory figure (hal.strategies.planner.cost, per rank, as `hal simulate` reports it) against
the peak bytes torch really holds on emulated runs of the same plans.

One 4-rank WorkerPool, HAL_EMULATE=cuda:2,ascend:2 (every chip EMULATED on this host's CPU, `hetero`
backend). Each plan is applied with hal.strategies.apply.apply_plan and trained two AdamW steps (what
hal/trainer/loop.py runs) in fp32; tests/_memory_cases.LiveStorageBytes counts the live tensor storages
each op creates on the rank (CPU has no allocator statistics, see that module) and reports the peak.
The prediction is `simulate(from_plan(plan))`'s memory_bytes for the rank with ModelFacts(dtype_bytes=4)
(the run is fp32), less the bridge's fixed staging buffers (BRIDGE_STAGING), which the bridge allocates
on its own threads where the counter cannot see them.

Margin: measured / predicted in [0.85, 1.05]. The cost model adds the peaks of phases that do not
coincide exactly (the loss's working set vs a layer's backward working set is already a max, but
gradients appear one layer at a time, so the sum over-states the peak by up to ~12% in the measured
plans: 0.88 for the one-stage DP plan); it should not under-state a peak (a plan it says fits must
fit), so the lower side is wide and the upper side 5% (temporaries no formula lists: rotary
tables, the batch, pipeline receive buffers). Measured ratios when written: 0.88 (DP4), 0.95-1.00
(PP2 x DP2), 0.93-0.97 (PP2 x DP2 full recompute), 0.90-0.99 (PP4), 0.95 (TP2 x DP2). Teeth: the
cost model before this test (no DDP gradient buckets, one fp32 logits copy for the loss, embedding
and head counted as TP-sharded) gave 1.05-1.51 on the same plans.

Not covered: ZeRO 2/3 (FSDP2 resizes parameter storages in place, which a storage counter cannot
follow) and MoE.
"""
import pytest

from hal.testing import WorkerPool
from hal.core.topology import Topology
from hal.strategies.models import ModelConfig
from hal.strategies.plan import Plan
from hal.strategies.planner.convert import from_plan
from hal.strategies.planner.cost import BRIDGE_STAGING, ModelFacts
from hal.strategies.planner.facts import chip_facts
from hal.strategies.planner.simulate import simulate

from . import _memory_cases as cases

EMULATE = "cuda:2,ascend:2"
MODEL = dict(name="mem", layers=4, hidden=128, heads=4, ffn=256, vocab=1024, seq=128)
CFG = ModelConfig(**MODEL)
TOPO = Topology.from_chips(["cuda"] * 2 + ["ascend"] * 2)
LOW, HIGH = 0.85, 1.05
pytestmark = pytest.mark.slow

PLANS = {
    "dp4": lambda: Plan.even(TOPO, CFG, 8, 1),
    "pp2xdp2-m4": lambda: Plan.even(TOPO, CFG, 16, 4, pp=2),
    "pp2xdp2-m4-recompute": lambda: Plan.even(TOPO, CFG, 16, 4, pp=2, recompute="full"),
    "pp4-m4": lambda: Plan.even(TOPO, CFG, 8, 4, pp=4),
    "tp2xdp2-m2": lambda: Plan.even(TOPO, CFG, 8, 2, tp=2),
}


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(4, env={"HAL_EMULATE": EMULATE, "OMP_NUM_THREADS": "1"}) as p:
        info = p.run(cases.init, timeout=180)
        assert [i["chip"] for i in info] == ["cuda", "cuda", "ascend", "ascend"] and all(i["emulated"] for i in info)
        yield p


def predicted(plan: Plan) -> list[float]:
    facts = [chip_facts(sc) for sc in TOPO.sub_clusters]
    sim = simulate(from_plan(plan, facts, {r: TOPO.node_of(r) for r in range(TOPO.world_size)}),
                   ModelFacts(CFG, dtype_bytes=4))
    return [r.memory_bytes - BRIDGE_STAGING for r in sim.ranks]


@pytest.mark.parametrize("name", list(PLANS))
def test_memory_figure_matches_measured_peak(pool, name):
    plan = PLANS[name]()
    plan.check(TOPO, CFG)
    pred = predicted(plan)
    res = pool.run(cases.peak_memory, plan.to_json(), MODEL, timeout=300)
    for r in res:
        ratio = r["peak"] / pred[r["rank"]]
        assert LOW <= ratio <= HIGH, (f"{name} rank {r['rank']}: measured peak {r['peak'] / 1e6:.2f} MB, cost "
                                      f"model {pred[r['rank']] / 1e6:.2f} MB, ratio {ratio:.3f} outside "
                                      f"[{LOW}, {HIGH}]")
        # the counter saw the training state: at least the fp32 weights, gradients and Adam moments
        assert r["peak"] >= 16 * r["params"] / (2 if name.startswith("tp") else 1) * 0.99


def test_counter_counts_and_frees():
    import torch
    mode = cases.LiveStorageBytes()
    with mode:
        a = torch.zeros(1000)            # 4000 bytes
        b = a.view(10, 100)              # same storage: not counted twice
        c = torch.ones(500, dtype=torch.float64)
        assert mode.live == 4000 + 4000
        del a, b
        assert mode.live == 4000
        del c
    assert mode.live == 0 and mode.peak == 8000
