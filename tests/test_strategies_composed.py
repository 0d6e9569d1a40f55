"""apply_plan composing PP x DP/FSDP2 x TP, with EP inside DP, on mixed emulated layouts with uneven
stages, a different TP and DP degree per stage and uneven micro-batch rows: after 3 SGD steps every
parameter matches a single-process run of the same model on the same global batch, and moved.

One 6-rank WorkerPool: cuda:3 (ranks 0-2), kunlun:2 (3-4), ascend:1 (5), all EMULATED on the CPU
(`hetero` backend). Layouts are plans over 4 of its ranks: 2+2 = [0,1,3,4], 3+1 = [0,1,2,5],
2+1+1 = [0,1,3,5]; one MoE case uses the whole 3+2+1 world (DP 2 x TP 2 x EP 2 in one stage). TP
groups stay inside one chip kind (Plan.check's rule); DP and EP groups cross chips.

Tolerance (tests/_pp_cases.TOL): 2e-6 absolute on fp32 parameters. The distributed step computes the
same sums in another order: per-replica partial gradients SUM-reduced over DP, TP's row-parallel
partial products all-reduced, each micro-batch's summed loss divided by the global token count instead
of one mean; that changes a step by a few fp32 ulps. Measured after 3 steps with lr 0.5: at most
1.2e-7 (2+1+1 with TP), 2e-8 to 3e-8 elsewhere, so 2e-6 leaves a margin of more than 10x. Teeth: every parameter
must move >= 1e-5 and >= 10 x its difference (the least-moving, attention wq/wk, move ~7e-5), so a
lost, doubled or unsummed share of a gradient (>= 1/8 of it with these row splits) fails.
The MoE reference runs the plan's micro-batches with gradient accumulation (capacity and aux loss are
per forward, see hal/strategies/moe.py); the dense reference is one forward of the whole global batch.
"""
import pytest


from . import _pp_cases as cases
from ._pp_cases import plan

EMULATE = "cuda:3,kunlun:2,ascend:1"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pool(shared_pools):
    p = shared_pools.get(6, {"HAL_EMULATE": EMULATE})  # the other test_strategies_* modules' ranks
    info = p.run(cases.init, "hetero", timeout=300)
    assert [i["chip"] for i in info] == ["cuda"] * 3 + ["kunlun"] * 2 + ["ascend"], info
    assert all(i["emulated"] for i in info), info
    return p


# stage = ((first layer, end layer), [(TP ranks, rows of each micro-batch), ...])
LAYOUTS = {
    # 2+2: stage 0 is one TP=2 replica on the cuda pair; stage 1 two kunlun replicas (3 and 1 rows)
    "2+2": [((0, 1), [((0, 1), 4)]), ((1, 4), [((3,), 3), ((4,), 1)])],
    # 3+1: stage 0 TP=2 on cuda 0,1; stage 1 DP across chips: cuda rank 2 takes 3 rows, ascend 1
    "3+1": [((0, 3), [((0, 1), 4)]), ((3, 4), [((2,), 3), ((5,), 1)])],
    # 2+1+1: stage 0 TP=2 on cuda; stage 1 kunlun and ascend replicas (1 and 3 rows)
    "2+1+1": [((0, 2), [((0, 1), 4)]), ((2, 4), [((3,), 1), ((5,), 3)])],
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("zero", [0, 3])
def test_pp_dp_tp_matches_single_process(pool, layout, zero):
    pj = plan(LAYOUTS[layout], num_microbatches=3, zero=zero)
    results = pool.run(cases.train_plan, pj, timeout=240)
    cases.check(results, pj, "HeteroPipeline")
    for r in results:  # the strategies really were applied: TP shards, DDP / FSDP2 wrappers
        if not r["roles"]:
            continue
        stage = r["roles"][0][0]
        if stage == 0:  # the TP=2 replica: its attention and MLP weights are DTensors
            assert r["dtensors"] >= 7 * (LAYOUTS[layout][0][0][1] - LAYOUTS[layout][0][0][0]), r["dtensors"]
            assert r["wrappers"] == (["plain"] if zero == 0 else ["FSDP2"])
        else:           # two replicas: DDP (zero 0) or FSDP2, every parameter a DTensor under FSDP2
            assert r["wrappers"] == (["DDP"] if zero == 0 else ["FSDP2"])
            if zero:
                assert r["dtensors"] == r["local_params"]


def test_zero2_with_recompute(pool):
    pj = plan(LAYOUTS["2+2"], num_microbatches=2, zero=2, recompute="full")
    cases.check(pool.run(cases.train_plan, pj, timeout=240), pj, "HeteroPipeline")


# EP inside DP: the MoE stage's replicas are its EP group; a faster chip hosts more experts
MOE_LAYOUTS = {
    "2+2": [((0, 2), [((0, 1), 4)], [[0, 1, 2, 3]]),
            ((2, 4), [((3,), 3), ((4,), 1)], [[0, 1, 2], [3]])],
    "3+1": [((0, 2), [((0,), 2), ((1,), 1), ((2,), 1)], [[0, 1], [2], [3]]),
            ((2, 4), [((5,), 4)], [[0, 1, 2, 3]])],
    "2+1+1": [((0, 2), [((0, 1), 4)], [[0, 1, 2, 3]]),
              ((2, 4), [((3,), 1), ((5,), 3)], [[0], [1, 2, 3]])],
    # all 6 ranks: stage 0 = two TP=2 replicas (cuda pair 3 rows, kunlun pair 1 row), EP over each TP
    # index ({0, 3} and {1, 4}); stage 1 = cuda rank 2 and ascend rank 5
    "3+2+1 tp-ep": [((0, 3), [((0, 1), 3), ((3, 4), 1)], [[0, 1, 2], [3]]),
                    ((3, 4), [((2,), 2), ((5,), 2)], [[0, 1], [2, 3]])],
}


@pytest.mark.parametrize("layout", list(MOE_LAYOUTS))
def test_ep_inside_dp_matches_single_process(pool, layout):
    pj = plan(MOE_LAYOUTS[layout], num_microbatches=2)
    results = pool.run(cases.train_plan, pj, "moe", timeout=240)
    cases.check(results, pj, "HeteroPipeline", "moe")
    for r in results:  # each rank kept exactly the experts the plan placed on its replica
        if not r["roles"]:
            continue
        stage, replica, _ = r["roles"][0]
        layers, _, experts = MOE_LAYOUTS[layout][stage]
        held = {n.split(".experts.")[1].split(".")[0] for n in r["params"] if ".experts." in n}
        assert held == {str(e) for e in experts[replica]}, (r["rank"], held)


# torch's schedules composed with FSDP2 and TP on equal chains (every stage the same DP/TP degree)
TORCH_COMPOSED = {
    # Interleaved1F1B x FSDP2: stages alternate between the cuda pair and the kunlun pair (rows 3 + 1)
    "interleaved-fsdp2": ("Interleaved1F1B", 3, [((0, 1), [((0,), 3), ((1,), 1)]), ((1, 2), [((3,), 3), ((4,), 1)]),
                                                 ((2, 3), [((0,), 3), ((1,), 1)]), ((3, 4), [((3,), 3), ((4,), 1)])]),
    # 1F1B x TP=2: a cuda TP pair, then a kunlun TP pair; chains (0 -> 3) and (1 -> 4)
    "1f1b-tp": ("1F1B", 0, [((0, 2), [((0, 1), 4)]), ((2, 4), [((3, 4), 4)])]),
}


@pytest.mark.parametrize("case", list(TORCH_COMPOSED))
def test_torch_schedules_composed(pool, case):
    schedule, zero, stages = TORCH_COMPOSED[case]
    pj = plan(stages, num_microbatches=4, schedule=schedule, zero=zero)
    results = pool.run(cases.train_plan, pj, runtime="torch", timeout=240)
    cases.check(results, pj, "TorchPipeline")
    members = [r for r in results if r["roles"]]
    assert all(r["wrappers"] == (["FSDP2"] if zero else ["plain"]) for r in members), members
    if case.endswith("tp"):
        assert all(r["dtensors"] >= 14 for r in members), [r["dtensors"] for r in members]


@pytest.mark.parametrize("stage_ranks", [[[0, 1], [2, 5]], [[0, 3], [1, 5]]], ids=["3+1", "2+1+1"])
def test_even_and_speed_weighted_plans_agree(pool, stage_ranks):
    # the naive even plan and a speed-weighted one (cuda 2x ascend, kunlun 1.5x) of the same model and
    # global batch: layers and rows move between chips, the trained parameters do not
    from hal.core.topology import Topology
    from hal.strategies.plan import Plan
    cfg, _ = cases.build("tiny")
    topo = Topology.from_chips(["cuda"] * 3 + ["kunlun"] * 2 + ["ascend"])
    kw = dict(num_microbatches=2, stage_ranks=stage_ranks, check=False)
    even = Plan.even(topo, cfg, 12, **kw)
    weighted = Plan.weighted(topo, cfg, 12, speeds={"cuda": 2.0, "kunlun": 1.5, "ascend": 1.0}, **kw)
    assert [s.layers for s in even.stages] != [s.layers for s in weighted.stages] or \
        [r.microbatch for s in even.stages for r in s.replicas] != \
        [r.microbatch for s in weighted.stages for r in s.replicas], "the two plans must differ"
    finals = []
    for p in (even, weighted):
        results = pool.run(cases.train_plan, p.to_json(), timeout=240)
        cases.check(results, p.to_json(), "HeteroPipeline")
        held = {}
        for r in results:
            held.update(r["params"])
        finals.append(held)
    gap = max((finals[0][n] - finals[1][n]).abs().max().item() for n in finals[0])
    assert gap <= cases.TOL, f"even and speed-weighted plans differ by {gap}"


def test_ep_on_torch_interleaved_schedule(pool):
    # MoE stages on torch's Interleaved1F1B: both chains run the same action order, so each stage's EP
    # all_to_all (across the cuda|kunlun replicas) stays matched
    stages = [((0, 1), [((0,), 3), ((3,), 1)], [[0, 1, 2], [3]]), ((1, 2), [((1,), 3), ((4,), 1)], [[0, 1], [2, 3]]),
              ((2, 3), [((0,), 3), ((3,), 1)], [[0], [1, 2, 3]]), ((3, 4), [((1,), 3), ((4,), 1)], [[0, 1, 2], [3]])]
    pj = plan(stages, num_microbatches=2, schedule="Interleaved1F1B")
    cases.check(pool.run(cases.train_plan, pj, "moe", timeout=240), pj, "TorchPipeline", "moe")


def test_example_plan_file_trains_like_one_process(pool):
    # docs/strategies.md's 3+1 example as a user loads it (ranks 0-3 of the pool: rank 3 is an emulated
    # kunlun here, not the ascend of the drawing; the maths does not depend on the chip kind)
    from hal.strategies.models import ModelConfig
    from hal.strategies.plan import Plan
    cfg, _ = cases.build("tiny")
    assert ModelConfig.from_toml("examples/models/tiny.toml") == cfg  # the same model the file is for
    pj = Plan.load("examples/plans/tiny-pp-3+1.toml").to_json()
    cases.check(pool.run(cases.train_plan, pj, timeout=240), pj, "HeteroPipeline")
