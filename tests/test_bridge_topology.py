"""The bridge's pure parts, no processes: sub-clusters and rails (homes for uneven sizes), settings,
reduce-op handling, the capability-driven route choice and the bit carriers."""

import pytest
import torch
import torch.distributed as dist

import hal.ccl_bridge
from hal.ccl_bridge.ccl import Ccl, _bits, _unbits
from hal.ccl_bridge.config import BridgeConfig
from hal.ccl_bridge.reduction import local_reduce, reduce_spec
from hal.ccl_bridge.topology import RankIdentity, build_topology
from hal.contract.compat import premul_sum
from hal import CapabilityMatrix, NotSupportedError
from hal.emulation.emulate import cpu_fabric_capabilities


def ids(spec: str, emulated: bool = True):
    """'cuda:2,ascend:2' -> identities in rank order."""
    out = []
    for item in spec.split(","):
        chip, count = item.split(":")
        out += [RankIdentity(chip, emulated, "cpu", "host")] * int(count)
    return out


def rails(topo):
    return [(list(r.members), r.first_part, r.end_part) for r in topo.rails]


def test_even_2_plus_2():
    t = build_topology(ids("cuda:2,ascend:2"))
    assert [list(s.ranks) for s in t.subclusters] == [[0, 1], [2, 3]]
    assert t.parts == 2 and t.rail_mode
    assert rails(t) == [([0, 2], 0, 1), ([1, 3], 1, 2)]
    assert t.leader_rail.members == (0, 2)


def test_uneven_3_plus_1_lone_rank_is_home_of_every_part():
    t = build_topology(ids("ascend:3,cuda:1"))
    assert t.parts == 3
    assert rails(t) == [([0, 3], 0, 1), ([1, 3], 1, 2), ([2, 3], 2, 3)]
    assert [r.index for r in t.rails_of(3)] == [0, 1, 2]
    assert t.parts_per_rank(1) == 3 and t.parts_per_rank(0) == 1


def test_uneven_2_plus_1_plus_1():
    t = build_topology(ids("cuda:2,ascend:1,kunlun:1"))
    assert t.k == 3 and t.parts == 2
    assert rails(t) == [([0, 2, 3], 0, 1), ([1, 2, 3], 1, 2)]


def test_4_plus_2_and_4_plus_3_partition_the_parts():
    t = build_topology(ids("cuda:4,ascend:2"))
    assert rails(t) == [([0, 4], 0, 1), ([1, 4], 1, 2), ([2, 5], 2, 3), ([3, 5], 3, 4)]
    t = build_topology(ids("cuda:4,ascend:3"))
    assert t.parts == 12
    covered = []
    for r in t.rails:
        covered += list(range(r.first_part, r.end_part))
        # each member is home of the rail's parts: index i of a sub-cluster with q parts owns [i*q, (i+1)*q)
        for c, (member, home) in enumerate(zip(r.members, r.homes)):
            q = t.parts_per_rank(c)
            assert t.index_in_cluster[member] == home
            assert home * q <= r.first_part and r.end_part <= (home + 1) * q
    assert covered == list(range(12))
    assert all(t.rails_of(r) for r in range(7))  # every rank forwards something


def test_interleaved_ranks_and_emulated_vs_native_split():
    mixed = [RankIdentity("cuda", False, "cuda", "a"), RankIdentity("ascend", True, "cpu", "a"),
             RankIdentity("cuda", False, "cuda", "b"), RankIdentity("cuda", True, "cpu", "b")]
    t = build_topology(mixed)
    assert [(s.chip, s.emulated, list(s.ranks)) for s in t.subclusters] == [
        ("cuda", False, [0, 2]), ("ascend", True, [1]), ("cuda", True, [3])]
    assert t.cluster_of == (0, 1, 0, 2) and t.index_in_cluster == (0, 0, 1, 0)


def test_block_all_to_all_is_one_decision_for_the_whole_group():
    # every member of a rail must speak one all_to_all protocol: blocks (tag = source) only when no rank
    # stages through host memory; a native CUDA rank among host ranks makes the whole group pack per peer
    # (a per-rank choice timed out in tests/test_native_lane.py's native case on an H100)
    from hal.ccl_bridge.backend import block_all_to_all
    from hal.ccl_bridge.config import BridgeConfig
    hosts = [RankIdentity("cpu", False, "cpu", "a")] * 3
    assert block_all_to_all(hosts + [RankIdentity("ascend", True, "cpu", "a")], BridgeConfig())
    assert not block_all_to_all(hosts + [RankIdentity("cuda", False, "cuda", "a")], BridgeConfig())
    assert not block_all_to_all(hosts, BridgeConfig(force_staging=True))


def test_single_chip_and_leader_only():
    t = build_topology(ids("ascend:4"))
    assert t.single_chip and t.rails == ()
    t = build_topology(ids("cuda:5,ascend:4"))
    assert t.parts == 20 and len(t.rails) == 8  # at most W - k + 1 = 8 rails
    t = build_topology(ids("cuda:5,ascend:4"), max_parts=16)  # 20 parts > 16: leader only
    assert not t.rail_mode and len(t.rails) == 1 and t.leader_rail.members == (0, 5)
    assert t.rail_with(1) is None and t.rail_with(0) is t.leader_rail


def test_config_from_env_and_errors():
    c = BridgeConfig.from_env({"HAL_BRIDGE_SMALL_BYTES": "100", "HAL_BRIDGE_WIRE_DTYPE": "bf16",
                               "HAL_BRIDGE_DEBUG": "1", "HAL_BRIDGE_PIPELINE_DEPTH": "3"})
    assert (c.small_bytes, c.wire_dtype, c.debug, c.pipeline_depth) == (100, "bfloat16", True, 3)
    assert BridgeConfig.from_env({}) == BridgeConfig()
    with pytest.raises(hal.ccl_bridge.BridgeConfigError, match="HAL_BRIDGE_WIRE_DTYPE='fp8'"):
        BridgeConfig.from_env({"HAL_BRIDGE_WIRE_DTYPE": "fp8"})
    with pytest.raises(hal.ccl_bridge.BridgeConfigError, match="HAL_BRIDGE_CHUNK_BYTES='big'"):
        BridgeConfig.from_env({"HAL_BRIDGE_CHUNK_BYTES": "big"})
    with pytest.raises(hal.ccl_bridge.BridgeConfigError, match="pipeline_depth=0"):
        BridgeConfig(pipeline_depth=0)


def test_reduce_specs():
    assert reduce_spec(dist.ReduceOp.AVG, torch.float32).average
    s = reduce_spec(premul_sum(0.5), torch.bfloat16)
    assert (s.inner, s.premul) == ("sum", 0.5)
    assert reduce_spec(dist.ReduceOp.PRODUCT, torch.int8).inner == "product"
    with pytest.raises(NotSupportedError, match="avg on int64"):
        reduce_spec(dist.ReduceOp.AVG, torch.int64)
    with pytest.raises(NotSupportedError, match="bitwise reduce op bor on float16"):
        reduce_spec(dist.ReduceOp.BOR, torch.float16)


def test_local_reduce_wraps_like_a_ccl():
    stack = torch.tensor([[100, -100], [100, -100]], dtype=torch.int8)
    assert local_reduce(stack, "sum", torch.int8).tolist() == [-56, 56]
    b = torch.tensor([[True, False], [True, True], [False, True]])
    assert local_reduce(b, "bxor", torch.bool).tolist() == [False, False]
    assert local_reduce(b, "sum", torch.bool).tolist() == [True, True]
    assert local_reduce(b, "product", torch.bool).tolist() == [False, False]


KUNLUN_LIKE = CapabilityMatrix.build("kunlun", "test: float sum, all_gather, send/recv only",
                                     collectives=("all_reduce", "all_gather_into_tensor", "send_recv"),
                                     dtypes=("float16", "bfloat16", "float32"), reduce_ops=("sum",))


@pytest.mark.parametrize("coll,dtype,op,route", [
    ("all_reduce", torch.float32, "sum", "native"),
    ("all_reduce", torch.float32, "max", "gather_reduce"),
    ("all_reduce", torch.int64, "sum", "gather_reduce"),
    ("reduce_scatter_tensor", torch.bfloat16, "sum", "via_all_reduce"),
    ("reduce", torch.float16, "sum", "via_all_reduce"),
    ("all_gather_into_tensor", torch.int64, None, "bits:float16"),
    ("broadcast", torch.float32, None, "via_all_gather"),
    ("all_to_all_single", torch.int8, None, "via_p2p"),
    ("send_recv", torch.bool, None, "bits:float16"),
])
def test_routes_for_a_ccl_that_lacks_most_things(coll, dtype, op, route):
    ccl = Ccl(None, KUNLUN_LIKE, "test group", 0, 2, torch.device("cpu"))
    assert ccl.route(coll, dtype, op) == route


def test_routes_on_gloo_widen_and_refuse():
    gloo = Ccl(None, cpu_fabric_capabilities("gloo"), "gloo", 0, 2, torch.device("cpu"))
    assert gloo.route("all_reduce", torch.int16, "sum") == "widen:int32"
    assert gloo.route("all_gather_into_tensor", torch.float8_e4m3fn, None) == "bits:uint8"
    nothing = Ccl(None, CapabilityMatrix(chip="acme", source="declares nothing"), "acme group", 0, 2,
                  torch.device("cpu"))
    with pytest.raises(NotSupportedError, match="acme group: all_reduce dtype=float32 op=sum .*'acme'"):
        nothing.route("all_reduce", torch.float32, "sum")


@pytest.mark.parametrize("dtype,n,blocks", [(torch.bool, 7, 1), (torch.int8, 5, 3), (torch.int64, 3, 2),
                                            (torch.float16, 1, 4)])
def test_bit_carriers_round_trip(dtype, n, blocks):
    src = (torch.arange(n * blocks) % 3).to(dtype)
    view, nb, pad = _bits(src, torch.float32, blocks)
    assert view.dtype == torch.float32 and view.numel() % blocks == 0
    dst = torch.zeros_like(src)
    if pad is None:
        dst.view(torch.uint8).copy_(view.view(torch.uint8)) if dst.dtype != torch.uint8 else dst.copy_(view)
    else:
        _unbits(dst, view.view(torch.uint8), nb, blocks)
    assert torch.equal(dst, src)


def test_registration_is_idempotent_and_claims_no_default_device():
    before = dict(dist.Backend.default_device_backend_map)
    hal.ccl_bridge.register()
    hal.ccl_bridge.register()
    assert dist.Backend.backend_list.count("hetero") == 1
    assert "cpu" in dist.Backend.backend_capability["hetero"]
    assert dist.Backend.default_device_backend_map == before
    assert "hetero" not in dist.Backend.default_device_backend_map.values()


@pytest.mark.parametrize("shape", ["cuda:2,ascend:2", "ascend:3,cuda:1", "cuda:2,ascend:1,kunlun:1", "cuda:4,ascend:2",
                                   "cuda:4,ascend:3", "cuda:3,kunlun:2,ascend:1"])
def test_all_to_all_routes(shape):
    """Each cross pair (s, d) takes one rail that has d, its relay is that rail's member in s's
    sub-cluster (s itself whenever s shares a rail with d), and the relays of a sub-cluster's
    sources towards one destination are spread over d's rails."""
    from hal.ccl_bridge.alltoall import cross_rails, relaying
    t = build_topology(ids(shape))
    table = cross_rails(t)
    relays_used = False
    for s in range(t.world_size):
        cs = t.cluster_of[s]
        for d in range(t.world_size):
            if t.cluster_of[d] == cs:
                assert table[s][d] == -1
                continue
            rail = t.rails[table[s][d]]
            assert d in rail.members
            shares = any(s in r.members and d in r.members for r in t.rails)
            assert (rail.members[cs] == s) == shares, (s, d, rail)
            relays_used |= rail.members[cs] != s
    assert any(relaying(t)) == relays_used
    if shape == "cuda:2,ascend:2":
        assert table[0][3] == 1 and table[1][2] == 0 and relaying(t) == (True, True)
    if shape in ("ascend:3,cuda:1", "cuda:2,ascend:1,kunlun:1"):
        assert relaying(t) == (False,) * t.k
    if shape == "cuda:4,ascend:2":  # ranks 0 and 1 reach rank 5 through different relays (2 and 3)
        assert {t.rails[table[0][5]].members[0], t.rails[table[1][5]].members[0]} == {2, 3}
