"""The MoE parameter accounting of the planner's cost model (hal/strategies/planner/cost.py) against what
apply_plan really leaves on each rank: expert parameters whole on every TP rank and never sharded by
ZeRO (DDP and FSDP2 leave them out), the rest TP-sharded and, at ZeRO 2/3, FSDP2-sharded over DP.

One 4-rank WorkerPool, HAL_EMULATE=cuda:2,ascend:2 (every chip EMULATED on this host's CPU, `hetero`
backend): Plan.even with TP 2 (the cuda pair and the ascend pair), DP 2, EP 2 (2 of the 4 experts per
replica), ZeRO 0, 2 and 3. Nothing is trained: the test counts each rank's local parameter elements
(DTensors by their local shard) and compares them with `ReplicaCost.expert_params_local` and
`params_local - expert_params_local` (/ dp at ZeRO 2/3). Margin: experts exact; the rest within 3% (the
cost model counts the RMSNorm weights as TP-sharded and the final norm not at all, while
SequenceParallel keeps norms whole). Measured when written: experts 98,304 = 98,304 on every rank at
every level; the rest 25,408 vs 25,216 predicted (ZeRO 0) and 12,704 vs 12,608 (ZeRO 2 and 3): +0.8%. Teeth: the cost
model before commit a31aee1 divided the experts by TP (x 0.5 here) and ZeRO-sharded them (x 0.5).
"""
import pytest

from hal.core.topology import Topology
from hal.strategies.models import ModelConfig
from hal.strategies.plan import Plan
from hal.strategies.planner.cost import ModelFacts, replica_cost
from hal.strategies.planner.facts import chip_facts

from . import _planner_moe_cases as cases

MODEL = dict(name="acct-moe", layers=2, hidden=64, heads=4, ffn=128, vocab=64, seq=16, experts=4, top_k=2)
CFG = ModelConfig(**MODEL)
TOPO = Topology.from_chips(["cuda"] * 2 + ["ascend"] * 2)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pool(shared_pools):
    p = shared_pools.get(4, {"HAL_EMULATE": "cuda:2,ascend:2"})  # test_bridge_strategies' ranks too
    info = p.run(cases.init, timeout=300)
    assert [i["chip"] for i in info] == ["cuda", "cuda", "ascend", "ascend"] and all(i["emulated"] for i in info)
    return p


@pytest.mark.parametrize("zero", [0, 2, 3])
def test_expert_and_dense_elements_per_rank_match_the_cost_model(pool, zero):
    plan = Plan.even(TOPO, CFG, 4, 1, tp=2, zero=zero, ep=True)
    assert [len(r.ranks) for r in plan.stages[0].replicas] == [2, 2] and plan.stages[0].experts == [[0, 1], [2, 3]]
    got = pool.run(cases.held_elements, plan.to_json(), MODEL, timeout=180)
    f = chip_facts(TOPO.sub_clusters[0])
    c = replica_cost(ModelFacts(CFG), f, 2, CFG.layers, True, True, 2, False, zero, 2, 1, experts_local=2)
    dense = (c.params_local - c.expert_params_local) / (2 if zero else 1)
    for r in got:
        assert r["expert"] == c.expert_params_local == CFG.layers * 2 * 3 * CFG.hidden * CFG.ffn, r
        assert r["dense"] == pytest.approx(dense, rel=0.03), (r, dense)
    assert got[0]["wrappers"] == (["StageModule"] if zero == 0 else ["FSDPStageModule"]), got[0]["wrappers"]
