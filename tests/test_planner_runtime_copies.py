"""The step simulator's runtime copy terms against the copies the runtime really makes.

hal/strategies/planner/simulate.py and op_profile.py price three kinds of memory traffic that the model's
own ops do not show but timed emulation charges (benchmarks/planner_prediction.py found each as a
prediction error): DDP's gradient bucket copies, FSDP2's gather / reduce-scatter packing, and the
`cat` sequence-parallel TP adds around each sequence all-gather / reduce-scatter. Here each is
counted op by op (hal.emulation.timed.record_ops: the bytes the clock charges) on a 2-rank gloo group of CPU
processes running the real wrappers as apply_plan builds them and HeteroPipeline drives them, and
compared with the formula the simulator uses. Exact byte counts: the formulas are counts of whole
tensors, so they hold to the byte (rel 1e-6) or the test fails.
"""
import pytest

from hal.testing import WorkerPool

from . import _runtime_copy_cases as cases


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(2, env={"OMP_NUM_THREADS": "1"}) as p:
        assert sorted(p.run(cases.init, timeout=180)) == [0, 1]
        yield p


def test_ddp_bucket_copies_only_in_the_last_backward(pool):
    r = pool.run(cases.ddp_copies, timeout=180)[0]
    P, per_mb = r["dense"], r["per_mb"]
    # forward: only DDP's broadcast of the module's buffers (rotary tables) into place on a synced
    # step's first forward, a few KB the simulator leaves out
    assert all(f <= 4 * r["buffers"] for f, _ in per_mb) and r["buffers"] < P / 20
    assert all(b == 0 for _, b in per_mb[:-1])          # no_sync: gradients accumulate in .grad
    # simulate: copy into the bucket inside the last backward (3 bytes counted per gradient byte:
    # src and dst read, dst written) and back after the reduction (3 more): 6 in all
    assert per_mb[-1][1] == pytest.approx(6 * P, rel=1e-6)


@pytest.mark.parametrize("zero", [2, 3])
@pytest.mark.parametrize("first,last", [(True, False), (False, True)])
def test_fsdp2_copies_match_fsdp_copy_bytes(pool, zero, first, last):
    from hal.strategies.planner.simulate import fsdp_copy_bytes
    r = pool.run(cases.fsdp_copies, zero, first, last, timeout=180)[0]
    P, ends, d, m = r["dense"], r["ends"], 2, cases.M
    for j, (f, b) in enumerate(r["per_mb"]):
        assert f == pytest.approx(fsdp_copy_bytes(P, ends, d, zero, "F", j, m), rel=1e-6, abs=1), (j, "F")
        assert b == pytest.approx(fsdp_copy_bytes(P, ends, d, zero, "B", j, m), rel=1e-6, abs=1), (j, "B")


@pytest.mark.parametrize("n_layers", [1, 2])
def test_sequence_parallel_cats_match_sp_relayout(pool, n_layers):
    import torch

    from hal.strategies.models import ModelConfig
    from hal.strategies.planner.op_profile import OpProfile, sp_relayout_seconds
    r = pool.run(cases.sp_cats, n_layers, timeout=180)[0]
    assert r["fwd"] == 4 * n_layers + 1 and r["bwd"] == 4 * n_layers + 1, r
    prof = OpProfile(ModelConfig(**cases.CFG), dtype=torch.float32)
    sec = sp_relayout_seconds(prof, 1.0, 2, n_layers, cases.ROWS, False)     # at 1 B/s: bytes
    assert sec["fwd"] == pytest.approx(r["fwd"] * 2 * r["full"], rel=1e-9)
    assert sec["bwd"] == pytest.approx(r["bwd"] * 2 * r["full"], rel=1e-9)
