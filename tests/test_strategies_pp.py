"""Pipeline parallel with uneven stages on the `hetero` backend: layers per stage, chip kind and DP
degree differ from stage to stage, activations are re-sliced by row ranges between stages of
different DP degree, and replicas take uneven micro-batch rows; 1F1B and GPipe on the hetero runtime,
torch's Schedule1F1B / ScheduleInterleaved1F1B / ScheduleZBVZeroBubble where the layout is equal
chains. After 3 SGD steps every parameter matches a single-process run of the same model on the same
global batch (mean loss) within TOL, and moved.

One 6-rank WorkerPool: cuda:3 (ranks 0-2), kunlun:2 (3-4), ascend:1 (5), all EMULATED on the CPU. The
layouts 2+2, 3+1, 2+1+1 are plans over 4 of its ranks ([0,1,3,4], [0,1,2,5], [0,1,3,5]); the other two
ranks take part in group creation only.

Tolerance (cases.TOL) 2e-6 absolute on fp32 parameters: the distributed run computes the same sums in
another order (per-replica partial gradients summed over DP, each micro-batch's loss divided by the
global token count instead of one mean), which changes each step by a few fp32 ulps; measured after 3
steps: at most 1.9e-8 here, 1.2e-7 in the composed tests with TP, so 2e-6 leaves a margin of more than 10x.
Teeth: every parameter moved at least 1e-5 from its initial value and at least 10 x its difference
from the reference (the attention wq/wk move least, ~7e-5; most move ~1e-2), so a lost, doubled or
mis-scaled micro-batch or replica (at least 1/8 of some gradient here) could not pass.
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
    assert all(i["emulated"] for i in info) and {i["backend"] for i in info} == {"hetero"}, info
    return p


LAYOUTS = {
    # 2+2: cuda replicas take 3 and 1 rows, kunlun replicas 2 and 2: rows re-sliced at the boundary
    "2+2": [((0, 3), [((0,), 3), ((1,), 1)]), ((3, 4), [((3,), 2), ((4,), 2)])],
    # 3+1: three cuda replicas (2, 1, 1 rows) run one layer, the lone ascend rank runs three
    "3+1": [((0, 1), [((0,), 2), ((1,), 1), ((2,), 1)]), ((1, 4), [((5,), 4)])],
    # 2+1+1: three stages on three chip kinds, DP 2 then 1 then 1
    "2+1+1": [((0, 2), [((0,), 1), ((1,), 3)]), ((2, 3), [((3,), 4)]), ((3, 4), [((5,), 4)])],
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("schedule", ["1F1B", "GPipe"])
def test_uneven_pipeline_matches_single_process(pool, layout, schedule):
    pj = plan(LAYOUTS[layout], num_microbatches=3, schedule=schedule)
    cases.check(pool.run(cases.train_plan, pj, timeout=180), pj, "HeteroPipeline")


# equal chains (every stage: 2 replicas taking 3 and 1 rows, TP 1): torch.distributed.pipelining's own
# schedules, one chain group per replica index; cuda ranks 0,1 and kunlun ranks 3,4 alternate stages
CHAINS = {
    "1F1B": [((0, 2), [((0,), 3), ((1,), 1)]), ((2, 4), [((3,), 3), ((4,), 1)])],
    # looped: stage i on chain rank i % 2 (0,3,0,3 and 1,4,1,4)
    "Interleaved1F1B": [((0, 1), [((0,), 3), ((1,), 1)]), ((1, 2), [((3,), 3), ((4,), 1)]),
                        ((2, 3), [((0,), 3), ((1,), 1)]), ((3, 4), [((3,), 3), ((4,), 1)])],
    # V order: stages 0 and 3 on the cuda ranks, 1 and 2 on the kunlun ranks
    "ZBVZeroBubble": [((0, 1), [((0,), 3), ((1,), 1)]), ((1, 2), [((3,), 3), ((4,), 1)]),
                      ((2, 3), [((3,), 3), ((4,), 1)]), ((3, 4), [((0,), 3), ((1,), 1)])],
}


@pytest.mark.parametrize("schedule", list(CHAINS))
def test_torch_schedules_on_equal_chains(pool, schedule):
    pj = plan(CHAINS[schedule], num_microbatches=4, schedule=schedule)
    cases.check(pool.run(cases.train_plan, pj, runtime="torch", timeout=180), pj, "TorchPipeline")


def test_layout_errors_are_typed(pool):
    # ZBV needs the V order (stages 0,3 on one rank, 1,2 on the other); the looped order is refused
    pj = plan(CHAINS["Interleaved1F1B"], num_microbatches=4, schedule="ZBVZeroBubble")
    errs = pool.run(cases.expect_error, pj, timeout=120)
    members = [e for r, e in enumerate(errs) if r in (0, 1, 3, 4)]
    assert all(e["type"] == "PipelineError" and "ZBVZeroBubble" in e["message"] and "v order" in e["message"]
               for e in members), members
    # TP ranks must ascend (DTensor puts shard t on the t-th smallest rank)
    pj = plan([((0, 4), [((1, 0), 4)])], num_microbatches=1)
    errs = pool.run(cases.expect_error, pj, timeout=120)
    assert all(e["type"] == "MeshError" and "stages[0].replicas[0].ranks = [1, 0]" in e["message"]
               for e in errs), errs
    # a global batch of the wrong size names the numbers
    pj = plan(LAYOUTS["3+1"], num_microbatches=3)
    errs = pool.run(cases.expect_error, pj, "auto", 5, timeout=120)
    assert all("global batch has 5 rows (targets 5), plan expects 3 micro-batches x 4 rows = 12" in e["message"]
               for e in errs), errs  # every rank, idle ones too: no rank is left in a collective


def test_row_transfers_of_the_documented_3_plus_1_layout():
    # docs/strategies.md's drawing (examples/plans/tiny-pp-3+1.toml), no processes needed
    from hal.strategies.mesh import Transfer, backward_transfers, forward_transfers, grids_from_plan
    from hal.strategies.plan import Plan
    a, b = grids_from_plan(Plan.load("examples/plans/tiny-pp-3+1.toml"))
    assert (a.rows, b.rows) == ([(0, 4), (4, 8)], [(0, 5), (5, 8)])
    assert sorted(forward_transfers(a, b), key=lambda t: (t.dst, t.start)) == [
        Transfer(0, 2, 0, 4), Transfer(1, 2, 4, 5), Transfer(1, 3, 5, 8)]
    assert sorted(backward_transfers(a, b), key=lambda t: (t.dst, t.start)) == [
        Transfer(2, 0, 0, 4), Transfer(2, 1, 4, 5), Transfer(3, 1, 5, 8)]


def test_tp_peer_rule_between_stages_of_different_tp_degree():
    # stage a: one TP=2 replica; stage b: two TP=1 replicas. Forward: each b rank hears from TP index 0
    # of a; backward: both TP ranks of a get the full gradient (t mod 1 = 0 of each b replica)
    from hal.strategies.mesh import StageGrid, Transfer, backward_transfers, forward_transfers
    a = StageGrid(0, (0, 2), [[0, 1]], [(0, 4)])
    b = StageGrid(1, (2, 4), [[2], [3]], [(0, 3), (3, 4)])
    assert forward_transfers(a, b) == [Transfer(0, 2, 0, 3), Transfer(0, 3, 3, 4)]
    assert backward_transfers(a, b) == [Transfer(2, 0, 0, 3), Transfer(3, 0, 3, 4),
                                        Transfer(2, 1, 0, 3), Transfer(3, 1, 3, 4)]


def test_stage_order_1f1b_and_gpipe():
    from hal.strategies.schedule import Schedule, stage_order
    # last stage alternates from the start; the first of 3 stages warms up with 2 forwards
    assert stage_order("1F1B", 2, 3, 3) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]
    assert stage_order(Schedule.ONE_F_ONE_B, 0, 3, 3) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1),
                                                           ("B", 2)]
    assert stage_order("1F1B", 0, 3, 4) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("B", 2),
                                            ("B", 3)]
    assert stage_order("1F1B", 1, 3, 4) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2),
                                            ("B", 3)]
    assert stage_order(Schedule.GPIPE, 1, 3, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    # every schedule of torch's multi-stage kind has no single-stage order
    with pytest.raises(ValueError, match="Interleaved1F1B"):
        stage_order("Interleaved1F1B", 0, 2, 4)


def test_schedule_is_a_string_enum():
    from hal.strategies.pipeline_parallel import HETERO_SCHEDULES, TORCH_SCHEDULES
    from hal.strategies.schedule import Schedule
    assert Schedule("GPipe") is Schedule.GPIPE and Schedule.GPIPE == "GPipe" and f"{Schedule.GPIPE}" == "GPipe"
    assert "1F1B" in HETERO_SCHEDULES and TORCH_SCHEDULES["ZBVZeroBubble"][2] == "v"
    assert {Schedule.ONE_F_ONE_B: 1}["1F1B"] == 1
