"""torch's own DDP, FSDP2 and pipelining schedules train on the `hetero` group of a mixed emulated
cluster (2 cuda + 2 ascend ranks) and match a single-process run of the same model and data.

Each case runs a few SGD steps of the hal.ops transformer (hal/strategies/models.py) on 4 ranks and every
rank compares the parameters it holds with a single-process reference it computes itself (same seeds).
Tolerance: every fp32 parameter within 1e-5 absolute of the reference (the difference is only
summation order: per-rank partial gradients added across the bridge vs one batched matmul; measured
about 1e-7 on flat gloo), while every compared parameter moved by at least 10 x that from its initial
value (most by 1000 x), so a strategy that skipped, doubled or failed to average the gradient exchange
cannot pass. The last test runs `hal demo` (the README's main job) for a few steps end to end.
"""
import pytest


from . import _strategy_cases as cases

BACKEND = "hetero"
EMULATE = "cuda:2,ascend:2"
TOL = 1e-5
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pool(shared_pools):
    p = shared_pools.get(4, {"HAL_EMULATE": EMULATE})  # test_planner_moe_runtime's ranks too
    info = p.run(cases.init, BACKEND, timeout=300)
    assert [i["chip"] for i in info] == ["cuda", "cuda", "ascend", "ascend"], info
    assert all(i["emulated"] for i in info) and {i["backend"] for i in info} == {BACKEND}, info
    return p


def _check(result: dict, expect_names=None) -> None:
    diffs, moved = result["param_diffs"], result["moved"]
    worst = {n: d for n, d in diffs.items() if d > TOL}
    assert not worst, f"parameters off the single-process run by more than {TOL}: {worst}"
    still = {n: m for n, m in moved.items() if m < 10 * TOL}
    assert not still, f"parameters that barely trained (the comparison would have no teeth): {still}"
    if expect_names is not None:
        assert result["names"] == expect_names
    if result["losses"]:
        assert result["losses"] == pytest.approx(result["ref_losses"], abs=1e-5), result


def test_ddp_matches_single_process(pool):
    results = pool.run(cases.train_ddp, timeout=120)
    full = sorted(n for n, _ in cases.build_model(cases.CFG).named_parameters())
    for r in results:
        _check(r, full)
    assert results[0]["losses"][-1] < results[0]["losses"][0]


def test_fsdp2_matches_single_process(pool):
    results = pool.run(cases.train_fsdp2, timeout=120)
    full = sorted(n for n, _ in cases.build_model(cases.CFG).named_parameters())
    for r in results:
        assert r["sharded_params"] == len(full)  # fully_shard really made every parameter a DTensor
        _check(r, full)


@pytest.mark.parametrize("schedule,ranks,n_micro", [
    ("1f1b", (0, 1, 2, 3), 4),   # 4 stages across both sub-clusters
    ("gpipe", (1, 2), 2),        # 2 stages on a new_group subgroup spanning the cuda|ascend boundary
])
def test_pipelining_matches_single_process(pool, schedule, ranks, n_micro):
    results = pool.run(cases.train_pipeline, schedule, ranks, n_micro, timeout=120)
    members = [r for r in results if r["member"]]
    assert [r["stage"] for r in members] == list(range(len(ranks)))
    held = sorted(n for r in members for n in r["names"])
    assert held == sorted(n for n, _ in cases.build_model(cases.CFG).named_parameters())  # stages cover the model
    for r in members:
        _check(r)
    assert [r["is_last"] for r in members] == [False] * (len(ranks) - 1) + [True]
    assert len(members[-1]["losses"]) == cases.STEPS


def test_hal_demo_end_to_end(capfd):
    # the README's main job, shortened: torchrun, 2+2 emulated ranks, DDP on hetero, parity report
    from hal.cli import main
    code = main(["demo", "--steps", "6", "--timeout", "60"])
    out = capfd.readouterr().out
    assert code == 0, out
    assert "EMULATED: no accelerator is used" in out and "process group: backend 'hetero', 4 ranks" in out
    assert "PARITY OK" in out and "replicas agree across ranks: max |rank r - rank 0| = 0.0e+00" in out
    ranks = [line.split()[:3] for line in out.splitlines() if line.strip().startswith("rank ")]
    assert ranks == [["rank", "0:", "cuda"], ["rank", "1:", "cuda"], ["rank", "2:", "ascend"], ["rank", "3:", "ascend"]]
    assert out.count("EMULATED on this host's CPU") == 4
