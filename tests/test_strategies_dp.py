"""Data parallel with uneven micro-batches (DDP and FSDP2) on mixed emulated layouts matches a single-
process step on the same global batch; an even and a speed-weighted plan give the same parameters.

One 6-rank WorkerPool (one start-up for the module): cuda:3 (ranks 0-2), kunlun:2 (3-4), ascend:1 (5),
every chip EMULATED on this host's CPU, default group `hetero`. The layouts are hetero subgroups of it
(as tests/test_bridge_collectives.py does): 2+2 = [0, 1, 3, 4], 3+1 = [0, 1, 2, 5], 2+1+1 = [0, 1, 3, 5].
Each layout gets a Plan built for its 4 chips by Plan.weighted (cuda twice or three times as fast as
the others), so ranks take 3/3/1/1 or 3/2/2/1 rows of each of 2 micro-batches; the plan travels to the
workers as JSON.

Tolerance: every fp32 parameter within 1e-5 absolute of the single-process run after 3 SGD steps.
The only legitimate difference is summation order (per-rank partial gradients summed by the bridge,
micro-batch gradients accumulated, vs one batched forward/backward), a few ulps of fp32 per step. Every
parameter must have moved by more than 10x the tolerance (lr 2.0, so that even the attention
query/key weights, whose gradients are tiny at init, do; most move 1000x), and the naive scheme (each
rank's mean loss, DDP's own averaging) is checked to miss by more than 100x the tolerance on an
uneven plan, so the comparison has teeth.
"""
import pytest

from hal.core.topology import Topology
from hal.strategies.plan import Plan

from . import _strategy_dp_cases as cases

EMULATE = "cuda:3,kunlun:2,ascend:1"
CHIPS = ["cuda", "cuda", "cuda", "kunlun", "kunlun", "ascend"]
LAYOUTS = {"2+2": (0, 1, 3, 4), "3+1": (0, 1, 2, 5), "2+1+1": (0, 1, 3, 5)}
SPEEDS = {"cuda": 2.0, "kunlun": 1.0, "ascend": 1.0}
GLOBAL_BATCH, MICROBATCHES = 16, 2
TOL = 1e-5
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pool(shared_pools):
    p = shared_pools.get(6, {"HAL_EMULATE": EMULATE})  # the other test_strategies_* modules' ranks
    info = p.run(cases.init, "hetero", timeout=300)
    assert [i["chip"] for i in info] == CHIPS, info
    assert all(i["emulated"] for i in info) and {i["backend"] for i in info} == {"hetero"}, info
    return p


def topology(ranks):
    return Topology.from_chips([CHIPS[r] for r in ranks])


def weighted(ranks, zero=0, speeds=SPEEDS):
    return Plan.weighted(topology(ranks), cases.CFG, GLOBAL_BATCH, speeds=speeds,
                         num_microbatches=MICROBATCHES, zero=zero)


def run(pool, plan, ranks, strategy, **kw):
    results = [r for r in pool.run(cases.train_dp, plan.to_json(), ranks, strategy, timeout=240, **kw)
               if r["member"]]
    assert len(results) == len(ranks)
    # each rank took the rows the plan gave it, and the same number of micro-batches
    assert [tuple(r["rows"]) for r in results] == [plan.rows(0, j) for j in range(len(ranks))]
    assert {r["microbatches"] for r in results} == {plan.num_microbatches}
    if strategy != "ddp-mean":
        # the global token count every rank divided by: all rows x seq tokens, whatever its own share
        assert all(t == GLOBAL_BATCH * cases.CFG.seq for r in results for t in r["tokens"])
    return results


def check_parity(results):
    for r in results:
        assert r["names"]
        assert r["max_param_diff"] <= TOL, f"off the single-process run by {r['max_param_diff']:.2e} > {TOL}"
        assert r["min_moved"] > 10 * TOL, f"a parameter barely trained ({r['min_moved']:.1e}): no teeth"
        assert r["losses"] == pytest.approx(r["ref_losses"], abs=1e-5)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_ddp_uneven_matches_single_process(pool, layout):
    ranks = LAYOUTS[layout]
    plan = weighted(ranks)
    rows = [r.microbatch for r in plan.stages[0].replicas]
    assert len(set(rows)) > 1, f"the plan must be uneven to test anything: {rows}"
    check_parity(run(pool, plan, ranks, "ddp"))


@pytest.mark.parametrize("layout,zero", [("2+2", 3), ("3+1", 3), ("2+1+1", 3), ("3+1", 2)])
def test_fsdp2_uneven_matches_single_process(pool, layout, zero):
    ranks = LAYOUTS[layout]
    results = run(pool, weighted(ranks, zero=zero), ranks, "fsdp")
    assert all(r["sharded"] for r in results)  # fully_shard really made every parameter a DTensor
    check_parity(results)


def test_naive_mean_of_means_misses_on_uneven_rows(pool):
    # the control: same uneven plan, each rank's mean loss and DDP's averaging -> a different step
    ranks = LAYOUTS["3+1"]
    plan = weighted(ranks, speeds={"cuda": 3.0, "ascend": 1.0})
    assert [r.microbatch for r in plan.stages[0].replicas] == [3, 2, 2, 1]
    results = run(pool, plan, ranks, "ddp-mean")
    assert min(r["max_param_diff"] for r in results) > 100 * TOL


def test_even_and_weighted_plans_give_the_same_parameters(pool):
    ranks = LAYOUTS["3+1"]
    topo = topology(ranks)
    even = Plan.even(topo, cases.CFG, GLOBAL_BATCH, num_microbatches=MICROBATCHES)
    fast = Plan.weighted(topo, cases.CFG, GLOBAL_BATCH, speeds={"cuda": 3.0, "ascend": 1.0},
                         num_microbatches=MICROBATCHES)
    assert [r.microbatch for r in even.stages[0].replicas] == [2, 2, 2, 2]
    assert [r.microbatch for r in fast.stages[0].replicas] == [3, 2, 2, 1]
    a = run(pool, even, ranks, "ddp", return_params=True)
    b = run(pool, fast, ranks, "ddp", return_params=True)
    check_parity(a)
    check_parity(b)
    pa, pb = a[0]["params"], b[0]["params"]
    worst = max((pa[k] - pb[k]).abs().max().item() for k in pa)
    assert worst <= TOL, f"the split changed the maths: even vs weighted differ by {worst:.2e}"


def test_replica_microbatches_takes_the_plan_rows_of_every_microbatch():
    import torch

    from hal.strategies.data_parallel import accumulate, replica_microbatches
    batch = torch.arange(16).view(16, 1)
    parts = replica_microbatches(batch, 2, (3, 6))
    assert [p.view(-1).tolist() for p in parts] == [[3, 4, 5], [11, 12, 13]]
    with pytest.raises(ValueError, match="16 rows does not split into 3"):
        replica_microbatches(batch, 3, (0, 1))
    with pytest.raises(ValueError, match=r"rows \[6, 9\) do not fit a micro-batch of 8"):
        replica_microbatches(batch, 2, (6, 9))
    with pytest.raises(ValueError, match="1 input and 0 target"):
        accumulate(torch.nn.Identity(), [batch], [], 16)
