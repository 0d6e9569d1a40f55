"""hal.core.topology: the one topology. Rails from a spec, from chips and from the bridge's run-time
identities are the same answer (3+1 included); nodes, chips and link figures with their sources
(spec, catalog, stated default); subgroups; the environment; typed errors naming the numbers."""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from hal.ccl_bridge.topology import RankIdentity, build_topology
from hal.core.cluster import load_cluster_spec, parse_cluster_spec
from hal.core.topology import DEFAULT_INTRA, DEFAULT_NIC, Link, Topology, TopologyError

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "clusters"

LAYOUTS = {
    "2+2": (["cuda"] * 2 + ["ascend"] * 2, [[0, 2], [1, 3]]),
    "3+1": (["ascend"] * 3 + ["cuda"], [[0, 3], [1, 3], [2, 3]]),
    "2+1+1": (["cuda"] * 2 + ["kunlun", "ascend"], [[0, 2, 3], [1, 2, 3]]),
    "4+2": (["cuda"] * 4 + ["ascend"] * 2, [[0, 4], [1, 4], [2, 5], [3, 5]]),
}


def _spec(sizes: list[tuple[str, str, int]], extra: str = "") -> str:
    out = 'name = "t"\n'
    for i, (name, chip, n) in enumerate(sizes):
        out += f'[[sub_clusters]]\nname = "{name}"\nchip = "{chip}"\nnodes = 1\nranks_per_node = {n}\n'
        out += "emulate = true\n" + ("colocate = true\n" if i else "") + extra
    return out


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_spec_chips_and_bridge_give_the_same_rails(name):
    chips, want = LAYOUTS[name]
    from_chips = Topology.from_chips(chips)
    runs = [(c, sum(1 for _ in g)) for c, g in itertools.groupby(chips)]
    spec = parse_cluster_spec(_spec([(c, c, n) for c, n in runs]), "t.toml")
    bridge = build_topology([RankIdentity(c, True, "cpu", "h") for c in chips])
    assert from_chips.rails == want
    assert Topology.from_spec(spec).rails == want
    assert [list(r.members) for r in bridge.rails] == want
    assert from_chips.layout == bridge  # the very same layout object content the bridge runs


def test_3_plus_1_issue_example():
    """The disagreement the issue names: a 3+1 spec now gives the bridge's rails."""
    spec = parse_cluster_spec(_spec([("npu", "ascend", 3), ("gpu", "cuda", 1)]), "t.toml")
    assert Topology.from_spec(spec).rails == [[0, 3], [1, 3], [2, 3]]
    topo = Topology.from_spec(spec)
    assert topo.layout.parts == 3 and [r.index for r in topo.layout.rails_of(3)] == [0, 1, 2]


def test_queries_on_the_h800_910b_spec():
    spec = load_cluster_spec(EXAMPLES / "h800-910b-32.toml")
    topo = Topology.from_spec(spec)
    assert topo.world_size == 32 and topo.num_nodes == 4 and topo.chips == ["cuda", "ascend"]
    h800, npu = topo.sub_clusters
    assert (h800.name, h800.chip, h800.model, h800.ranks) == ("h800", "cuda", "H800", list(range(16)))
    assert h800.nodes == [list(range(8)), list(range(8, 16))] and h800.node_ids == [0, 1]
    assert npu.node_ids == [2, 3] and not npu.emulated
    assert topo.chip_of(16) == "ascend" and topo.node_of(15) == 1 and topo.node_of(16) == 2
    assert topo.sub_cluster_of(20) is npu and topo.sub_cluster("h800") is h800
    for r in range(32):
        assert topo.node_of(r) == spec.assignment(r).node
    assert len(topo.rails) == 16 and topo.rails[5] == [5, 21]


def test_link_sources_spec_catalog_default():
    topo = Topology.from_spec(load_cluster_spec(EXAMPLES / "h800-910b-32.toml"))
    h800, npu = topo.sub_clusters
    assert h800.nic_bandwidth == Link(50e9, "spec")                  # "400 Gb/s" in the spec
    assert h800.intra_bandwidth.bytes_per_s == 200e9                 # H800 NVLink, from the catalog
    assert h800.intra_bandwidth.source.startswith("catalog:") and "H800" in h800.intra_bandwidth.source
    assert npu.nic_bandwidth == Link(25e9, "spec")
    assert npu.intra_bandwidth.bytes_per_s == DEFAULT_INTRA and npu.intra_bandwidth.source.startswith("default")
    # a rail crosses nodes: its slowest NIC; inside one node of one sub-cluster: the intra link
    assert topo.rail_bandwidth(0) == Link(25e9, "spec")
    assert topo.link(0, 1) == h800.intra_bandwidth
    assert topo.link(0, 8) == h800.nic_bandwidth                     # same sub-cluster, other node
    assert topo.link(0, 16) == Link(25e9, "spec")
    # no spec figure and an uncatalogued chip: the stated defaults, never empty
    cpu = Topology.from_chips(["cpu", "cpu", "cuda"])
    assert cpu.sub_clusters[0].nic_bandwidth.bytes_per_s == DEFAULT_NIC
    assert cpu.sub_clusters[1].nic_bandwidth.source.startswith("catalog:")   # cuda default model (H100)


def test_spec_bandwidth_overrides_reach_the_topology():
    spec = parse_cluster_spec(_spec([("gpu", "cuda", 2), ("npu", "ascend", 2)],
                                    extra='intra_bandwidth = "100 GB/s"\nnic_bandwidth = "800 Gb/s"\n'), "t.toml")
    for s in Topology.from_spec(spec).sub_clusters:
        assert s.intra_bandwidth == Link(100e9, "spec") and s.nic_bandwidth == Link(100e9, "spec")


def test_two_spec_sub_clusters_of_one_chip_share_a_chip_group():
    """H100 + H800 (both cuda) + 2 ascend: two spec sub-clusters with their own models and links, but
    one CCL fabric and one set of rails, as the bridge groups them by chip at run time."""
    text = _spec([("h100", "cuda", 1), ("h800", "cuda", 1), ("npu", "ascend", 2)])
    text = text.replace('name = "h100"\nchip = "cuda"\n', 'name = "h100"\nchip = "cuda"\nmodel = "H100"\n')
    text = text.replace('name = "h800"\nchip = "cuda"\n', 'name = "h800"\nchip = "cuda"\nmodel = "H800"\n')
    topo = Topology.from_spec(parse_cluster_spec(text, "t.toml"))
    assert [s.name for s in topo.sub_clusters] == ["h100", "h800", "npu"]
    assert topo.sub_clusters[0].intra_bandwidth.bytes_per_s != topo.sub_clusters[1].intra_bandwidth.bytes_per_s
    assert [list(g.ranks) for g in topo.layout.subclusters] == [[0, 1], [2, 3]]
    assert topo.rails == [[0, 2], [1, 3]]
    assert topo.rails == [list(r.members) for r in build_topology(
        [RankIdentity("cuda", True, "cpu", "h")] * 2 + [RankIdentity("ascend", True, "cpu", "h")] * 2).rails]


def test_subgroup_layout_matches_the_bridge():
    topo = Topology.from_chips(["cuda"] * 3 + ["kunlun"] * 2 + ["ascend"])
    assert topo.layout.parts == 6
    for ranks in ([0, 1, 3, 4], [0, 1, 2, 5], [0, 1, 3, 5]):
        ids = [RankIdentity(topo.chip_of(r), True, "cpu", "h") for r in ranks]
        assert topo.group_layout(ranks) == build_topology(ids)


def test_colocated_and_single_chip_and_leader_only():
    laptop = Topology.from_spec(load_cluster_spec(EXAMPLES / "laptop-2x2.toml"))
    assert laptop.num_nodes == 1 and {laptop.node_of(r) for r in range(4)} == {0}
    one = Topology.from_chips(["ascend"] * 4)
    assert one.layout.single_chip and one.rails == []
    big = Topology.from_spec(load_cluster_spec(EXAMPLES / "three-vendor-1024.toml"))
    assert big.layout.parts == 512 and not big.layout.rail_mode and big.rails == [[0, 512, 768]]
    big_spec = load_cluster_spec(EXAMPLES / "three-vendor-1024.toml")
    assert len(Topology.from_spec(big_spec, max_parts=512).rails) == 512


def test_from_env(tmp_path):
    t = Topology.from_env({"HAL_EMULATE": "cuda:3,ascend:1"})
    assert t.rails == [[0, 3], [1, 3], [2, 3]] and t.sub_clusters[0].emulated
    t = Topology.from_env({"HAL_EMULATE": "ascend"}, world_size=2)
    assert t.chips == ["ascend"] and t.world_size == 2
    t = Topology.from_env({"HAL_CLUSTER": str(EXAMPLES / "laptop-2x2.toml")})
    assert t.name == "laptop-2x2" and t.rails == [[0, 2], [1, 3]]
    assert not Topology.from_env({"HAL_EMULATE": "cuda:2,ascend:2", "HAL_BRIDGE_MAX_PARTS": "1"}).layout.rail_mode
    with pytest.raises(TopologyError, match="world size 4 but world_size is 8"):
        Topology.from_env({"HAL_CLUSTER": str(EXAMPLES / "laptop-2x2.toml")}, world_size=8)
    with pytest.raises(TopologyError, match="HAL_EMULATE.*HAL_CLUSTER"):
        Topology.from_env({})
    with pytest.raises(TopologyError, match="HAL_BRIDGE_MAX_PARTS='x'"):
        Topology.from_env({"HAL_EMULATE": "cuda:1,ascend:1", "HAL_BRIDGE_MAX_PARTS": "x"})


def test_errors_name_the_numbers():
    t = Topology.from_chips(["cuda", "cuda", "ascend"])
    with pytest.raises(TopologyError, match=r"rank 3 is outside the world of 3 ranks \(cuda: 2 \+ ascend: 1\)"):
        t.chip_of(3)
    with pytest.raises(TopologyError, match="no sub-cluster 'npu'; sub-clusters: \\['cuda', 'ascend'\\]"):
        t.sub_cluster("npu")
    with pytest.raises(TopologyError, match="chips = \\[\\]"):
        Topology.from_chips([])
    with pytest.raises(TopologyError, match="max_parts = 0"):
        Topology.from_chips(["cuda", "ascend"], max_parts=0)


def test_describe_is_plain_data():
    import json
    d = Topology.from_spec(load_cluster_spec(EXAMPLES / "h800-910b-32.toml")).describe()
    assert json.loads(json.dumps(d)) == d
    assert d["sub_clusters"][0]["nic_bandwidth"] == {"bytes_per_s": 50e9, "source": "spec"}
