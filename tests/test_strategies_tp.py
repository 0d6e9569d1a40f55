"""Tensor parallel (hal.strategies.tensor_parallel.apply_tp: torch's parallelize_module / DTensor) inside a
sub-cluster matches a single-process run, and is refused across chip kinds.

One 6-rank WorkerPool (module-scoped, emulated): cuda:3 (ranks 0-2), kunlun:2 (3-4), ascend:1 (5), the
`hetero` world. In one call every sub-cluster trains its own TP group at once: TP 3 on the cuda ranks
[0, 1, 2], TP 2 on the kunlun ranks [3, 4], TP 1 on the ascend rank [5] (the mixed layout a plan gives:
a different TP degree per chip kind), each on the whole global batch of the tiny GPT
(hal.strategies.models, 6 heads: 2 per rank at TP 3, 3 at TP 2), with and without sequence-parallel norms,
dense, and MoE with every family feature ("family": GQA, q/k/v biases, q/k norms, rope scaling, tied
head, a gated shared expert). Parameters after 3 SGD steps, gathered from their DTensor shards, are
compared with a single-process run computed on the rank.

Tolerance: every fp32 parameter within 1e-5 absolute of the single-process run. The difference is
summation order only (a row-parallel linear sums TP partial products by all-reduce / reduce-scatter
instead of inside one matmul; measured at most 3.3e-7 here); every compared parameter moved by at
least 10 x that, so a missing or doubled gradient reduction (e.g. of the sequence-parallel norm
gains) cannot pass.
"""
import pytest


from . import _strategy_tp_cases as cases

EMULATE = "cuda:3,kunlun:2,ascend:1"
CHIPS = ["cuda", "cuda", "cuda", "kunlun", "kunlun", "ascend"]
PER_CHIP = [[0, 1, 2], [3, 4], [5]]
TOL = 1e-5
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pool(shared_pools):
    p = shared_pools.get(6, {"HAL_EMULATE": EMULATE})  # the other test_strategies_* modules' ranks
    info = p.run(cases.init, timeout=300)  # a bound, not a timing: start-up on a loaded host
    assert [i["chip"] for i in info] == CHIPS and all(i["emulated"] for i in info), info
    return p


def _check(r: dict) -> None:
    worst = {n: d for n, d in r["param_diffs"].items() if d > TOL}
    assert not worst, f"TP {r['tp']}: parameters off the single-process run by more than {TOL}: {worst}"
    print(f"  max |param - single process| = {max(r['param_diffs'].values()):.2e}, "
          f"least moved {min(r['moved'].values()):.2e}")
    still = {n: m for n, m in r["moved"].items() if m < 10 * TOL}
    assert not still, f"TP {r['tp']}: parameters that barely trained: {still}"
    assert r["losses"] == pytest.approx(r["ref_losses"], abs=1e-5)


@pytest.mark.parametrize("kind,sp", [("dense", True), ("dense", False), ("family", True)])
def test_tp_matches_single_process(pool, kind, sp):
    results = pool.run(cases.train_tp, PER_CHIP, kind, sp, timeout=400)
    assert [r["tp"] for r in results] == [3, 3, 3, 2, 2, 1]
    for r in results:
        _check(r)
    r0, r3 = results[0], results[3]
    linears = [n for n in r0["names"] if ".attn.w" in n or ".mlp.w" in n]
    norms = [n for n in r0["names"] if n.startswith("blocks.") and "norm" in n]
    assert set(linears) <= set(r0["sharded"]) and (set(norms) <= set(r0["sharded"])) == sp
    assert not any("moe." in n or n.startswith(("embed", "head", "norm")) for n in r0["sharded"])
    assert r0["local_shapes"]["blocks.0.attn.wq.weight"] == (16, 48)   # 2 of 6 heads of 8 dims
    assert r3["local_shapes"]["blocks.0.attn.wo.weight"] == (48, 24)   # row-parallel: 3 heads' inputs
    assert results[5]["sharded"] and results[5]["local_shapes"]["blocks.0.attn.wq.weight"] == (48, 48)


@pytest.mark.parametrize("with_topology", [True, False])
def test_tp_across_chip_kinds_is_refused(pool, with_topology):
    partition = [[0, 1], [2, 3], [4, 5]]   # [2, 3] is cuda + kunlun, [4, 5] kunlun + ascend
    out = pool.run(cases.tp_error, partition, with_topology, timeout=300)
    assert out[0] is None and out[1] is None   # [0, 1] lies inside the cuda sub-cluster
    for rank in (2, 3):
        kind, msg = out[rank]
        assert kind == "TensorParallelError" and "TP group [2, 3]" in msg
        assert "rank 2: cuda" in msg and "rank 3: kunlun" in msg
    assert "rank 4: kunlun" in out[4][1] and "rank 5: ascend" in out[5][1]


def test_heads_must_divide_by_tp(pool):
    out = pool.run(cases.tp_error, PER_CHIP, True, "dense", 4, timeout=300)   # 4 heads, TP 3 on cuda
    kind, msg = out[0]
    assert kind == "TensorParallelError" and "4 attention heads" in msg and "TP degree 3" in msg
    assert out[3] is None and out[5] is None   # 4 heads split over TP 2 and TP 1 are fine


def test_kernel_refusing_dtensors_is_reported(pool):
    out = pool.run(cases.probe_refusal, PER_CHIP, timeout=300)
    for rank, msg in enumerate(out):
        assert msg is not None, f"rank {rank}: a kernel refusing DTensors went unreported"
        assert "hal.ops.linear kernel" in msg and f"on chip {CHIPS[rank]!r}" in msg
        assert "does not accept DTensors" in msg and "does not have a sharding strategy registered" in msg


# ---- one process: checks that need no group ----------------------------------------------------------
SPEC = """
name = "two-cuda-one-ascend"
[[sub_clusters]]
name = "h100-a"
chip = "cuda"
nodes = 1
ranks_per_node = 2
[[sub_clusters]]
name = "h100-b"
chip = "cuda"
nodes = 1
ranks_per_node = 2
[[sub_clusters]]
name = "910b"
chip = "ascend"
nodes = 1
ranks_per_node = 2
"""


def test_tp_ranks_checked_against_the_topology():
    from hal.core.cluster import parse_cluster_spec
    from hal.core.topology import Topology
    from hal.strategies.tensor_parallel import TensorParallelError, check_tp_ranks
    topo = Topology.from_spec(parse_cluster_spec(SPEC, known_chips=None))
    check_tp_ranks([0, 1], topo)
    check_tp_ranks([4, 5], topo)
    with pytest.raises(TensorParallelError, match=r"TP group \[1, 2\] spans sub-clusters \(rank 1: cuda \(h100-a\), "
                                                  r"rank 2: cuda \(h100-b\)\)"):
        check_tp_ranks([1, 2], topo)   # same chip kind, two sub-clusters (two fabrics)
    with pytest.raises(TensorParallelError, match=r"TP group \[3, 4\] spans chip kinds .*rank 4: ascend \(910b\)"):
        check_tp_ranks([3, 4], topo)


def test_sizes_must_divide():
    from hal.strategies.models import ModelConfig, build_model
    from hal.strategies.tensor_parallel import TensorParallelError, _check_divides
    model = build_model(ModelConfig(name="t", layers=1, hidden=48, heads=6, ffn=100, vocab=16, seq=8))
    _check_divides(model, 2)
    with pytest.raises(TensorParallelError, match="blocks.0.attn: 6 attention heads .* do not divide by the TP degree 4"):
        _check_divides(model, 4)
    with pytest.raises(TensorParallelError, match="blocks.0.mlp: ffn width 100 does not divide by TP degree 3"):
        _check_divides(model, 3)
