"""Expert data parallel through apply_plan: EP groups inside a DP group (a Plan stage's `ep` < dp) match
a single-process run of the same MoE model on the same global batches.

One 4-rank WorkerPool, all EMULATED on the CPU (`hetero` backend): cuda:2 (ranks 0-1), kunlun:2
(ranks 2-3). The tiny MoE GPT of tests/_pp_cases.py (4 blocks, 4 experts top-2, capacity factor
1.25: no drops over the whole micro-batch at the start, but capacity over one EP group's half would
drop) trains 3 SGD steps with one stage of DP = 4 replicas (uneven rows 3, 3, 1, 1 per micro-batch,
2 micro-batches):
  - EP = 2: EP groups {0, 1} (cuda) and {2, 3} (kunlun), each hosting experts [0, 1] | [2, 3]; the
    expert-DP groups {0, 2} and {1, 3} cross chips and SUM the copies' gradients (reduce_expert_grads);
    routing statistics (capacity, drop order, aux f_e) over the whole DP group (hal/strategies/moe.py);
  - EP = 1: every replica holds every expert, the expert-DP group is the DP group (no all_to_all);
  - EP = 2 under FSDP2 (zero 3): experts are left out of FSDP2 and reduced the same way;
  - composed: TP 2 in each of 2 replicas (an expert-DP group per TP index), and 2 pipeline stages of
    2 replicas each (ep 1).
Every held parameter must be within tests/_pp_cases.TOL (2e-6 absolute, fp32) of the single-process
run, and have moved by >= 1e-5 and >= 10 x its difference. SGD makes the final parameters
init - lr x (sum of the step gradients), so matching parameters after 3 steps means the gradients of
each step matched (within TOL / lr = 4e-6); the loss of every step must match within 1e-5. Copies of
an expert in different EP groups must agree exactly (a missing or doubled expert-DP reduction fails
that and the tolerance). Measured (-s): at most 1.2e-8. Checked by hand: without reduce_expert_grads
the copies disagree; with routing statistics per EP group (no stats_group) parameters are off by
up to 6e-4, so both halves of expert data parallel are held by this test.
"""
import json

import pytest

from hal.testing import WorkerPool

from . import _pp_cases as cases

ENV = {"HAL_EMULATE": "cuda:2,kunlun:2", "OMP_NUM_THREADS": "1"}
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(4, env=ENV) as p:
        info = p.run(cases.init, "hetero", timeout=180)   # a bound on start-up, not a timing
        assert [i["chip"] for i in info] == ["cuda"] * 2 + ["kunlun"] * 2, info
        assert all(i["emulated"] for i in info), info
        yield p


def _plan(ep: int, zero: int = 0) -> str:
    placement = {2: [[0, 1], [2, 3]], 1: [[0, 1, 2, 3]]}[ep] * (4 // ep)
    pj = json.loads(cases.plan([((0, 4), [((0,), 3), ((1,), 3), ((2,), 1), ((3,), 1)], placement)],
                               num_microbatches=2, zero=zero))
    pj["stages"][0]["ep"] = ep
    return json.dumps(pj)


@pytest.mark.parametrize("ep,zero", [(2, 0), (1, 0), (2, 3)], ids=["ep2-ddp", "ep1-ddp", "ep2-fsdp2"])
def test_expert_dp_matches_single_process(pool, ep, zero):
    from hal.strategies.plan import Plan
    pj = _plan(ep, zero)
    plan = Plan.from_json(pj)
    assert plan.stages[0].ep_degree == ep and plan.expert_dp_ranks(0, 0, 0) == [0, 1, 2, 3][::ep]
    results = pool.run(cases.train_plan, pj, "moe", timeout=300)
    cases.check(results, pj, "HeteroPipeline", "moe")
    placement = plan.stages[0].experts
    for r in results:   # each rank holds exactly its EP index's experts
        (stage, replica, _), = r["roles"]
        held = {int(n.split(".experts.")[1].split(".")[0]) for n in r["params"] if ".experts." in n}
        assert held == set(placement[replica]), (r["rank"], held)
        assert r["wrappers"] == (["DDP"] if zero == 0 else ["FSDP2"])
    ref = cases.cached_reference("moe", plan.global_batch, plan.num_microbatches)
    worst = max((r["params"][n] - ref["params"][n]).abs().max().item() for r in results for n in r["params"])
    print(f"  ep {ep}, zero {zero}: max |param - single process| = {worst:.2e} (tolerance {cases.TOL})")


# composed: TP 2 inside each replica (expert-DP group per TP index: {0, 2} and {1, 3}), and a
# 2-stage pipeline whose stages each have 2 replicas with every expert (ep 1, expert-DP = DP)
COMPOSED = {
    "tp2-ep1": [((0, 4), [((0, 1), 3), ((2, 3), 1)], [[0, 1, 2, 3]] * 2, 1)],
    "pp2-ep1": [((0, 2), [((0,), 3), ((1,), 1)], [[0, 1, 2, 3]] * 2, 1),
                ((2, 4), [((2,), 2), ((3,), 2)], [[0, 1, 2, 3]] * 2, 1)],
}


@pytest.mark.parametrize("case", list(COMPOSED))
def test_expert_dp_composed_with_tp_and_pp(pool, case):
    stages = COMPOSED[case]
    pj = json.loads(cases.plan([st[:3] for st in stages], num_microbatches=2))
    for st, (_, _, _, ep) in zip(pj["stages"], stages):
        st["ep"] = ep
    pj = json.dumps(pj)
    results = pool.run(cases.train_plan, pj, "moe", timeout=300)
    cases.check(results, pj, "HeteroPipeline", "moe")
    if case.startswith("tp"):
        assert all(r["dtensors"] > 0 for r in results)   # TP really sharded the attention


def test_ep_degree_is_validated_where_the_plan_is_built():
    from hal.strategies.plan import Plan, PlanError
    pj = json.loads(_plan(2))
    pj["stages"][0]["ep"] = 3
    with pytest.raises(PlanError, match=r"ep.*3.*does not divide.*4 replicas.*4 % 3 = 1"):
        Plan.from_json(json.dumps(pj))
    pj["stages"][0]["ep"] = 2
    pj["stages"][0]["experts"][2] = [0, 2]
    with pytest.raises(PlanError, match=r"experts\[2\].*EP group 1.*must host \[0, 1\]"):
        Plan.from_json(json.dumps(pj))
    pj["stages"][0]["experts"] = [[0], [1, 2, 3], [0], [1, 2, 3]]
    plan = Plan.from_json(json.dumps(pj))   # an uneven placement, repeated in every group, is fine
    assert Plan.from_toml(plan.to_toml()) == plan
    assert plan.ep_ranks(0, 0, 3) == [2, 3] and plan.expert_dp_ranks(0, 0, 1) == [1, 3]
