"""Expert parallel (strategies.moe, strategies.expert_parallel) matches a single-process run.

One 6-rank WorkerPool (module-scoped, emulated): cuda:3 (ranks 0-2), kunlun:2 (3-4), ascend:1 (5).
Its `hetero` subgroups are the required mixed layouts: 2+2 [0, 1, 3, 4], 3+1 [0, 1, 2, 5],
2+1+1 [0, 1, 3, 5], plus the whole 3+2+1 world. In each, the tiny MoE LM (tests/_strategy_ep_cases.py)
trains 3 SGD steps with EP over the subgroup (uneven expert placement: the cuda ranks host more experts,
one rank may host none; uneven rows per rank, one rank may feed none) and DDP over the same group for
the non-expert parameters (experts ignored by DDP), with capacity dropping ON: capacity is computed on
the global micro-batch in global token order, so the distributed run drops exactly the tokens the
single-process run drops, and the test checks the drop counts match and are > 0.

Tolerance: every fp32 parameter within 2e-5 absolute of the single-process run (rounding only: the
distributed run sums gradient contributions in another order, across the bridge and index_add; the
routing decisions are discrete and identical, which the equal drop counts show). Every compared
parameter moved by at least 10 x that, so skipped, doubled or unreduced gradients cannot pass.
"""
import pytest

from hal.testing import WorkerPool

from . import _strategy_ep_cases as cases

EMULATE = "cuda:3,kunlun:2,ascend:1"
CHIPS = ["cuda", "cuda", "cuda", "kunlun", "kunlun", "ascend"]
TOL = 2e-5
pytestmark = pytest.mark.slow

# shape -> (ranks, expert placement per EP rank, rows per EP rank): faster chips host more experts
CASES = {
    "2+2": ((0, 1, 3, 4), [[0, 1, 2], [3, 4, 5], [6], [7]], [3, 3, 1, 1]),
    "3+1": ((0, 1, 2, 5), [[7, 0], [1, 2, 3], [4, 5], [6]], [2, 2, 3, 1]),
    "2+1+1": ((0, 1, 3, 5), [[0, 1, 2, 3], [4, 5, 6], [7], []], [4, 2, 2, 0]),
    "3+2+1": ((0, 1, 2, 3, 4, 5), [[0, 1], [2, 3], [4], [5], [6], [7]], [2, 2, 1, 1, 1, 1]),
}


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(6, env={"HAL_EMULATE": EMULATE}) as p:
        info = p.run(cases.init, timeout=120)
        assert [i["chip"] for i in info] == CHIPS and all(i["emulated"] for i in info), info
        yield p


def _check(r: dict) -> None:
    worst = {n: d for n, d in r["param_diffs"].items() if d > TOL}
    assert not worst, f"EP rank {r['ep_rank']}: parameters off the single-process run by more than {TOL}: {worst}"
    still = {n: m for n, m in r["moved"].items() if m < 10 * TOL}
    assert not still, f"EP rank {r['ep_rank']}: parameters that barely trained: {still}"
    assert r["losses"] == pytest.approx(r["ref_losses"], abs=1e-5)
    if "ref_drops" in r:
        assert r["drops"] == r["ref_drops"]


@pytest.mark.parametrize("shape", list(CASES))
def test_ep_matches_single_process(pool, shape):
    ranks, placement, rows = CASES[shape]
    results = pool.run(cases.train_ep, ranks, placement, rows, 1.0, timeout=180)
    members = [r for r in results if r["member"]]
    assert [r["ep_rank"] for r in members] == list(range(len(ranks)))
    for r, ids in zip(members, placement):
        _check(r)
        assert r["hosted"] == sorted(ids)  # each rank holds exactly its experts ...
        assert r["ddp_ignored"] == r["expert_names"] and all("experts." in n for n in r["ddp_ignored"])
    every = sorted(n for r in members for n in r["names"] if "experts." in n)
    full = sorted(n for n, _ in cases.build(1.0).named_parameters() if "experts." in n)
    assert every == full  # ... and together they hold every expert exactly once
    assert sum(sum(d) for d in members[0]["drops"]) > 0, "capacity never dropped: the case has no teeth"
    # tokens crossed ranks: a rank sends what it routes to other hosts and receives for its experts
    assert all(sum(t[0][1] for t in r["traffic"]) > 0 for r, ids in zip(members, placement) if ids)


def test_ep_without_dropping_matches(pool):
    ranks, placement, rows = CASES["3+1"]
    results = pool.run(cases.train_ep, ranks, placement, rows, 0, timeout=180)
    for r in (r for r in results if r["member"]):
        _check(r)
        assert all(d == [0] * cases.LAYERS for d in r["drops"])


@pytest.mark.parametrize("sp", [True, False])
def test_ep_inside_dp_with_tp(pool, sp):
    # 2+2 as a plan lays it out: replica 0 = TP group [0, 1] (cuda), replica 1 = TP group [3, 4]
    # (kunlun); EP group (= DP group) of tp index 0 is [0, 3], of tp index 1 is [1, 4]. The cuda
    # replica takes 3 of 4 rows and hosts 3 of 4 experts; ranks 2 and 5 sit out.
    replicas, placement, rows = [[0, 1], [3, 4]], [[0, 1, 2], [3]], [3, 1]
    results = pool.run(cases.train_ep_dp_tp, replicas, placement, rows, sp, timeout=240)
    assert [r["member"] for r in results] == [True, True, False, True, True, False]
    members = [r for r in results if r["member"]]
    assert [(r["replica"], r["tp_index"], r["ep_rank"]) for r in members] == [(0, 0, 0), (0, 1, 0), (1, 0, 1), (1, 1, 1)]
    for r in members:
        _check(r)
        assert r["hosted"] == placement[r["ep_rank"]] and r["sharded"] > 0
    assert sum(sum(d) for d in members[0]["drops"]) > 0, "capacity never dropped: the case has no teeth"
