"""The `hetero` bridge against flat gloo and exact references, on emulated mixed clusters.

One 6-rank WorkerPool (module-scoped): cuda:3 (ranks 0-2), kunlun:2 (3-4), ascend:1 (5), emulated. Its
world is a 3+2+1 group; the required shapes are hetero subgroups of it:
  2+2   ranks [0, 1, 3, 4]  cuda x2, kunlun x2: Kunlun's XCCL declares only float SUM, all_gather,
                            gather and send/recv, so that sub-cluster exercises nearly every emulation
                            route (bit carriers, widening, via_*, gather_reduce)
  3+1   ranks [0, 1, 2, 5]  cuda x3, ascend x1: the lone ascend rank is home of every part, on 3 rails
  2+1+1 ranks [0, 1, 3, 5]  cuda x2, kunlun x1, ascend x1
For each shape: every collective (all_to_all over rails, uneven splits) x {float32, bfloat16, float16,
int64} x every reduce op x sizes {1, 7, 4096, 1000003}, plus float64/int8/uint8/int16/int32/bool (and BAND/BOR/BXOR) at sizes
{7, 4096}. Settings make 4096 elements take the rail path and 1000003 float32 travel as 4 pipelined
chunks. Checks that do not depend on the shape run once, on the 3+2+1 world.
"""
import pytest

from hal.testing import WorkerPool

from . import _bridge_cases as cases

EMULATE = "cuda:3,kunlun:2,ascend:1"
SHAPES = {"2+2": [0, 1, 3, 4], "3+1": [0, 1, 2, 5], "2+1+1": [0, 1, 3, 5]}
ENV = {"HAL_EMULATE": EMULATE, "HAL_CPU_CCL": "gloo", "HAL_BRIDGE_SMALL_BYTES": "4096",
       "HAL_BRIDGE_CHUNK_BYTES": str(1 << 20), "HAL_BRIDGE_PIPELINE_DEPTH": "2"}
MAIN_DTYPES = ["float32", "bfloat16", "float16", "int64"]
MORE_DTYPES = ["float64", "int8", "uint8", "int16", "int32", "bool"]
REDUCE_OPS = ["sum", "avg", "max", "min", "product"]
BIT_OPS = ["band", "bor", "bxor"]
SIZES = [1, 7, 4096, 1000003]
SMALL_SIZES = [7, 4096]


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(6, env=ENV) as p:
        info = p.run(cases.setup, 60.0, timeout=180)
        assert all(i["type"] == "HeteroProcessGroup" for i in info), info
        p.world_topology = info[0]["topology"]
        yield p


@pytest.fixture(params=list(SHAPES))
def shape(request):
    return request.param, SHAPES[request.param]


def _run(pool, coll, dtypes, ops, sizes, group_ranks=None, env=None, rail_mode=True, timeout=300):
    results = pool.run(cases.matrix, coll, dtypes, ops, sizes, group_ranks, 1, env, timeout=timeout)
    assert all(r["rail_mode"] in (rail_mode, None) for r in results), results
    failures = [f"rank {r}: {f}" for r, res in enumerate(results) for f in res["failures"]]
    assert not failures, f"ranks {group_ranks}: {len(failures)} failures:\n" + "\n".join(failures[:20])
    return sum(res["checks"] for res in results)


def test_topology_of_shape(pool, shape):
    name, ranks = shape
    topo = pool.run(cases.topology, ranks)[ranks[0]]
    assert "+".join(str(len(s["ranks"])) for s in topo["subclusters"]) == name and topo["rail_mode"]
    world = pool.world_topology
    assert [len(s["ranks"]) for s in world["subclusters"]] == [3, 2, 1] and world["parts"] == 6


@pytest.mark.parametrize("family", ["all_reduce+reduce", "reduce_scatter"])
def test_reductions_main_dtypes(pool, shape, family):
    checks = _run(pool, family, MAIN_DTYPES, REDUCE_OPS, SIZES, group_ranks=shape[1])
    # per member rank: every (dtype, op, size) but AVG on int64 (refused, as torch's gloo refuses it),
    # each with two hetero calls vs the exact reference (plus gloo comparisons where gloo has the op)
    assert checks >= 4 * 2 * (4 * 5 * 4 - 4)


@pytest.mark.parametrize("family", ["all_reduce+reduce", "reduce_scatter"])
def test_reductions_more_dtypes(pool, shape, family):
    checks = _run(pool, family, MORE_DTYPES, REDUCE_OPS + BIT_OPS, SMALL_SIZES, group_ranks=shape[1])
    assert checks >= 4 * 2 * 2 * (2 * 4 + 4 * 7 + 5)


@pytest.mark.parametrize("family", ["broadcast", "all_gather", "all_to_all", "gather+scatter", "send_recv"])
def test_data_movement(pool, shape, family):
    sizes = SIZES if family in ("broadcast", "all_gather") else [1, 7, 4096]
    checks = _run(pool, family, MAIN_DTYPES, ["sum"], sizes, group_ranks=shape[1])
    checks += _run(pool, family, MORE_DTYPES, ["sum"], [7], group_ranks=shape[1])
    assert checks >= 4 * 2 * (4 * len(sizes) + 6)


def test_world_3_plus_2_plus_1(pool):
    """The pool's world itself (3+2+1, 6 parts), small and large."""
    for family in ("all_reduce+reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all"):
        reducing = family in ("all_reduce+reduce", "reduce_scatter")
        assert _run(pool, family, ["float32", "int64"] if reducing else ["float32"],
                    ["sum", "max"] if reducing else ["sum"], [7, 1000003]) > 0


@pytest.mark.parametrize("name", list(SHAPES) + ["3+2+1"])
def test_all_to_all_takes_the_rails(pool, name):
    """all_to_all crosses sub-clusters on rails only (never the global gloo group), each direction
    of a rail on its own gloo group, every cross element crosses exactly once, and where a source shares a rail with its destination (3+1,
    2+1+1: always) nothing is handed to a sub-cluster mate first."""
    ranks = SHAPES.get(name, list(range(6)))
    res = [r for r in pool.run(cases.a2a_accounting, ranks) if r is not None]
    assert len(res) == len(ranks) and all(r["exact"] for r in res), res
    assert not any(r["global_a2a"] for r in res), res
    assert sum(r["rail"] for r in res) == sum(r["cross_source"] for r in res) > 0, res
    # each direction of a rail on its own gloo group (hal.ccl_bridge.duplex): every rail has a back
    # group, and the blocks to lower rail positions (some, never all) went on it
    assert all(r["back_groups"] for r in res), res
    assert 0 < sum(r["rail_back"] for r in res) < sum(r["rail"] for r in res), res
    relayed = sum(r["relay"] for r in res)
    if name in ("3+1", "2+1+1"):
        assert relayed == 0, res
    else:  # 2+2 and 3+2+1: a source not on its destination's rail hands its block to the relay
        assert relayed > 0, res


def test_emulation_routes_were_taken(pool):
    """The 2+2 checks went through the emulation routes where the chip lacks things (Kunlun)."""
    _run(pool, "all_reduce+reduce", ["float32", "int64"], ["sum", "max"], [4096], group_ranks=SHAPES["2+2"])
    _run(pool, "reduce_scatter", ["float32"], ["sum"], [4096], group_ranks=SHAPES["2+2"])
    r = pool.run(cases.routes, SHAPES["2+2"])[3]  # rank 3 is kunlun
    assert r.get("all_reduce float32 max") == "gather_reduce", r
    assert r.get("reduce_scatter_tensor float32 sum") == "via_all_reduce", r
    assert r.get("all_gather_into_tensor int64 -", "").startswith("bits:"), r


def test_barrier_and_async_order(pool):
    for res in pool.run(cases.barrier_and_async):
        assert res["values"] == res["want"] and res["future_done"] and res["completed"]


def test_not_supported_is_typed_and_harmless(pool):
    for res in pool.run(cases.not_supported):
        assert res["avg_int64"].startswith("NotSupportedError") and "int64" in res["avg_int64"]
        assert res["band_float"].startswith("NotSupportedError")
        assert res["after"] == [6.0] * 4


def test_premul_sum(pool):
    for diff, tol in pool.run(cases.premul_sum, 4099):
        assert diff <= tol


def test_staging_is_reused(pool):
    for res in pool.run(cases.staging_reuse, 300001):
        assert res["after"] == res["before"], res
        assert res["value"] == 6.0 ** 4 and res["rs"] == 6.0  # 1 warm-up + 3 all_reduces of ones


def test_bf16_wire(pool):
    for res in pool.run(cases.wire_bf16, 100003):
        assert res["wire"] == "bfloat16"
        assert not res["failures"], res["failures"]


def test_subgroups(pool):
    """Mixed subgroups run the bridge (the shapes above are subgroups too); a one-chip subgroup
    passes through to the chip's own group."""
    kinds = pool.run(cases.subgroup_kinds, [0, 1])
    assert kinds[0][0] != "HeteroProcessGroup" and kinds[0][1] == [3.0, 3.0]
    kinds = pool.run(cases.subgroup_kinds, [3, 4])
    assert kinds[3][0] != "HeteroProcessGroup" and kinds[4][1] == [9.0, 9.0]
    kinds = pool.run(cases.subgroup_kinds, [2, 5])
    assert kinds[2][0] == "HeteroProcessGroup" and kinds[5][1] == [9.0, 9.0]


@pytest.mark.parametrize("family", ["all_reduce+reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all"])
def test_leader_only_topology(pool, family):
    """HAL_BRIDGE_MAX_PARTS=1 forces the leader-only fallback (for sizes with a huge lcm)."""
    ops = ["sum", "max"] if family in ("all_reduce+reduce", "reduce_scatter") else ["sum"]
    assert _run(pool, family, ["float32", "int64"], ops, [7, 100003], env={"HAL_BRIDGE_MAX_PARTS": "1"},
                rail_mode=False) > 0


@pytest.mark.parametrize("family", ["all_reduce+reduce", "reduce_scatter", "all_gather", "broadcast",
                                    "all_to_all", "gather+scatter", "send_recv"])
def test_host_staging_path(pool, family):
    """HAL_BRIDGE_FORCE_STAGING=1: every cross step copies through the staging buffers a native chip
    uses (device <-> pinned host), here with CPU tensors."""
    ops = ["sum", "max"] if family in ("all_reduce+reduce", "reduce_scatter") else ["sum"]
    assert _run(pool, family, ["float32", "int8"], ops, [7, 100003], env={"HAL_BRIDGE_FORCE_STAGING": "1"}) > 0


def test_debug_mode_names_both_shapes(pool):
    for res in pool.run(cases.debug_mismatch):
        assert res["debug"] is True
        err = res["error"]
        assert err is not None and "rank 0: all_reduce float32 shape (4,)" in err, err
        assert "rank 1: all_reduce float32 shape (5,)" in err, err
        assert res["after"] == 6.0


def test_settings_must_agree(pool):
    for res in pool.run(cases.config_disagreement):
        assert res.startswith("BridgeConfigError") and "rank 0" in res and "rank 3" in res, res


def test_frozen_rank_in_all_to_all(pool):
    """The lone ascend rank (5) freezes between its intra step and the rails inside an all_to_all:
    every other rank raises a typed bridge error naming all_to_all_single and #1 within timeout +
    grace (+ slack for a loaded machine); the frozen rank's own caller is bounded too. Runs last
    in the pool's use but for the single-chip test (its group stays broken)."""
    timeout, grace, slack = 2.0, 1.0, 2.0
    outcomes = pool.run(cases.fault, "all_to_all.rail.cross", "freeze", 5, 6000, timeout, timeout + grace + 1.5,
                        "all_to_all", grace, timeout=60, check=False)
    for o in outcomes:
        assert o.ok, f"rank {o.rank}: {o.error}"
        res = o.value
        assert res["type"] in ("BridgeTimeoutError", "BridgePeerError"), f"rank {o.rank}: {res}"
        assert res["op"] == "all_to_all_single" and res["seq"] == 1, f"rank {o.rank}: {res}"
        assert "all_to_all_single" in res["error"] and "#1" in res["error"], res["error"]
        assert res["seconds"] <= timeout + grace + slack, f"rank {o.rank} took {res['seconds']:.1f}s: {res}"
    assert outcomes[5].value["type"] == "BridgeTimeoutError", outcomes[5].value


def test_single_chip_world_passes_through():
    with WorkerPool(2, env={"HAL_EMULATE": "ascend:2", "HAL_CPU_CCL": "gloo"}) as p:
        p.run(cases.setup, 30.0, timeout=120)
        for name, backend, chip, values in p.run(cases.world_group_kind):
            # the chip's own CPU fabric (gloo here, possibly behind hal.emulation.gloo_group's strided-safe wrapper)
            assert name in ("ProcessGroup", "StridedSafeGloo") and backend == "ProcessGroupGloo" and chip == "ascend"
            assert values == [3.0, 3.0, 3.0]
