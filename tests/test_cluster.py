"""Cluster specs: the shipped examples load with the right world sizes and torchrun-order rank
assignment; every refusal names the file, the field path, the value and the TOML line."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hal.core.cluster import load_cluster_spec, parse_bandwidth, parse_cluster_spec
from hal.core.topology import Topology
from hal.contract.errors import ClusterSpecError

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "clusters"


@pytest.mark.parametrize("name,world,last_chip,nodes", [
    ("laptop-2x2", 4, "ascend", 1), ("h800-910b-32", 32, "ascend", 4), ("three-vendor-1024", 1024, "kunlun", 128),
])
def test_examples_load(name, world, last_chip, nodes):
    spec = load_cluster_spec(EXAMPLES / f"{name}.toml")
    assert spec.world_size == world and spec.num_nodes == nodes
    first, last = spec.assignment(0), spec.assignment(world - 1)
    assert first.chip == "cuda" and first.local_index == 0 and first.node == 0 and first.local_rank == 0
    assert last.chip == last_chip and last.node == nodes - 1


def test_laptop_is_one_node_all_emulated():
    spec = load_cluster_spec(EXAMPLES / "laptop-2x2.toml")
    got = [(a.chip, a.emulated, a.sub_cluster, a.local_index, a.node, a.local_rank)
           for a in map(spec.assignment, range(4))]
    assert got == [("cuda", True, "cuda", 0, 0, 0), ("cuda", True, "cuda", 1, 0, 1),
                   ("ascend", True, "ascend", 0, 0, 2), ("ascend", True, "ascend", 1, 0, 3)]
    assert Topology.from_spec(spec).rails == [[0, 2], [1, 3]]


def test_h800_910b_assignment_boundaries():
    spec = load_cluster_spec(EXAMPLES / "h800-910b-32.toml")
    a15, a16 = spec.assignment(15), spec.assignment(16)
    assert (a15.chip, a15.model, a15.sub_cluster, a15.local_index, a15.node, a15.local_rank) == \
        ("cuda", "H800", "h800", 15, 1, 7)
    assert (a16.chip, a16.model, a16.sub_cluster, a16.local_index, a16.node, a16.local_rank) == \
        ("ascend", "910B2", "ascend-910b", 0, 2, 0)
    assert not a16.emulated
    assert spec.sub_clusters[0].nic_bandwidth == pytest.approx(50e9)   # "400 Gb/s"
    assert Topology.from_spec(spec).rails[0] == [0, 16] and len(Topology.from_spec(spec).rails) == 16


def test_three_vendor_assignment():
    spec = load_cluster_spec(EXAMPLES / "three-vendor-1024.toml")
    assert [spec.assignment(r).chip for r in (511, 512, 767, 768)] == ["cuda", "ascend", "ascend", "kunlun"]
    a = spec.assignment(768)
    assert (a.sub_cluster, a.local_index, a.node, a.local_rank) == ("kunlun", 0, 96, 0)
    assert list(spec.ranks_of("ascend")) == list(range(512, 768))
    assert spec.chips == ["cuda", "ascend", "kunlun"]


def test_uneven_rails():
    spec = parse_cluster_spec(SPEC.format(rpn=3, extra="").replace("nodes = 2\n", "nodes = 1\n")
                              .replace('ranks_per_node = 2\n', 'ranks_per_node = 1\n', 1), "u.toml")
    assert [s.world_size for s in spec.sub_clusters] == [1, 3]
    # the bridge's rails (hal.core.topology): the lone rank 0 is home of every part, on every rail
    assert Topology.from_spec(spec).rails == [[0, 1], [0, 2], [0, 3]]


def test_rank_outside_world():
    spec = load_cluster_spec(EXAMPLES / "laptop-2x2.toml")
    with pytest.raises(ClusterSpecError, match=r"rank 4 is outside the world of 4 ranks \(cuda: 1 x 2 \+ ascend: 1 x 2\)"):
        spec.assignment(4)


@pytest.mark.parametrize("text,expected", [("200 GB/s", 200e9), ("400 Gb/s", 50e9), (1.5e9, 1.5e9),
                                           ("1.6TB/s", 1.6e12), ("100 Mb/s", 12.5e6)])
def test_bandwidth_units(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected)


# line numbers below refer to this text (line 1 is 'name = "t"')
SPEC = '''name = "t"

[[sub_clusters]]
name = "gpu"
chip = "cuda"
nodes = 1
ranks_per_node = 2

[[sub_clusters]]
name = "npu"
chip = "ascend"
nodes = 2
ranks_per_node = {rpn}
{extra}'''


def _fail(text, **kw):
    with pytest.raises(ClusterSpecError) as info:
        parse_cluster_spec(text, "spec.toml", **kw)
    return info.value


def test_ranks_per_node_zero_names_field_value_line():
    err = _fail(SPEC.format(rpn=0, extra=""))
    assert str(err).startswith("spec.toml:13: sub_clusters[1].ranks_per_node = 0:")
    assert "greater than or equal to 1" in str(err)
    assert (err.field, err.value, err.line) == ("sub_clusters[1].ranks_per_node", 0, 13)


def test_wrong_type_names_field_value_line():
    err = _fail(SPEC.format(rpn='"eight"', extra=""))
    assert (err.field, err.value, err.line) == ("sub_clusters[1].ranks_per_node", "eight", 13)


def test_unknown_field():
    err = _fail(SPEC.format(rpn=8, extra="gpus_per_node = 8\n"))
    assert err.line == 14 and "sub_clusters[1].gpus_per_node" in str(err) and "ranks_per_node" in str(err)


def test_missing_field_points_at_the_table():
    err = _fail(SPEC.format(rpn=8, extra="").replace("nodes = 2\n", ""))
    assert err.field == "sub_clusters[1].nodes" and err.line == 9 and "missing" in str(err)


def test_duplicate_sub_cluster_name():
    err = _fail(SPEC.format(rpn=8, extra="").replace('name = "npu"', 'name = "gpu"'))
    assert (err.field, err.value, err.line) == ("sub_clusters[1].name", "gpu", 10)
    assert "duplicate" in str(err) and "sub_clusters[0]" in str(err)


def test_unknown_chip_lists_known_chips():
    err = _fail(SPEC.format(rpn=8, extra="").replace('chip = "ascend"', 'chip = "tpu"'),
                known_chips=["cpu", "cuda", "ascend"])
    assert (err.field, err.value, err.line) == ("sub_clusters[1].chip", "tpu", 11)
    assert "['ascend', 'cpu', 'cuda']" in str(err)


def test_unknown_model_lists_catalog_models():
    err = _fail(SPEC.format(rpn=8, extra='model = "910C"\n'))
    assert (err.field, err.value, err.line) == ("sub_clusters[1].model", "910C", 14)
    assert "910B2" in str(err)


def test_bad_bandwidth():
    err = _fail(SPEC.format(rpn=8, extra='nic_bandwidth = "fast"\n'))
    assert (err.field, err.line) == ("sub_clusters[1].nic_bandwidth", 14) and "'200 GB/s'" in str(err)


def test_colocate_needs_single_node_sub_clusters():
    err = _fail(SPEC.format(rpn=8, extra="colocate = true\n"))
    assert (err.field, err.line) == ("sub_clusters[1].colocate", 14)
    assert "nodes = 2" in str(err) and "nodes = 1" in str(err)


def test_no_sub_clusters():
    err = _fail('name = "empty"\nsub_clusters = []\n')
    assert err.field == "sub_clusters" and err.line == 2


def test_invalid_toml_names_line():
    err = _fail('name = "x"\n[[sub_clusters]\n')
    assert err.line == 2 and str(err).startswith("spec.toml:2: not valid TOML")


def test_unreadable_file(tmp_path):
    with pytest.raises(ClusterSpecError, match="cannot read cluster spec"):
        load_cluster_spec(tmp_path / "missing.toml")


def test_file_errors_name_the_path(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text(SPEC.format(rpn=-1, extra=""))
    with pytest.raises(ClusterSpecError, match=rf"{f}:13: sub_clusters\[1\]\.ranks_per_node = -1"):
        load_cluster_spec(f)


def test_load_checks_chips_against_a_plugin_manager(tmp_path):
    class FakePM:
        chips = {"cpu": None, "cuda": None}
    f = tmp_path / "c.toml"
    f.write_text(SPEC.format(rpn=8, extra=""))
    with pytest.raises(ClusterSpecError, match=r"c\.toml:11: sub_clusters\[1\]\.chip = 'ascend'.*\['cpu', 'cuda'\]"):
        load_cluster_spec(f, pm=FakePM())


def test_cli_cluster_show(capsys):
    """`hal cluster show` validates chips against the plugins and prints the layout with link figures."""
    import hal
    from hal import cli
    from hal.core import plugin_manager
    from tests.test_plugin_manager import make_plugin
    pm = hal.PluginManager()
    for chip in ("cuda", "ascend"):
        pm.register(make_plugin(name=f"fake_{chip}", chip=chip), name=f"fake_{chip}")
    saved = plugin_manager._DEFAULT
    plugin_manager.set_plugin_manager(pm)
    try:
        assert cli.main(["cluster", "show", str(EXAMPLES / "h800-910b-32.toml")]) == 0
        text = capsys.readouterr().out
        assert "world size 32, 4 node(s), 16 rail(s)" in text
        assert "h800" in text and "0-15" in text and "16-31" in text
        assert "200 GB/s (catalog)" in text and "50 GB/s (spec)" in text and "25 GB/s (default)" in text
        assert "note: ascend-910b intra bandwidth is a default" in text
        assert "rails: [0, 16]; [1, 17]; [2, 18]; [3, 19] ... (12 more)" in text
        assert cli.main(["cluster", "show", str(EXAMPLES / "three-vendor-1024.toml")]) == 2
        assert "sub_clusters[2].chip = 'kunlun': no registered plugin provides this chip" in capsys.readouterr().err
        pm.register(make_plugin(name="fake_kunlun", chip="kunlun"), name="fake_kunlun")
        assert cli.main(["cluster", "show", str(EXAMPLES / "three-vendor-1024.toml")]) == 0
        # 512 + 256 + 256 ranks: lcm 512 parts > the bridge's default 256, so it runs leader-only
        assert "1 rail (leader-only: 512 parts > max_parts" in capsys.readouterr().out
        assert cli.main(["cluster", "show", "--json", str(EXAMPLES / "laptop-2x2.toml")]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["rails"] == [[0, 2], [1, 3]] and shown["rail_mode"] is True
        assert shown["sub_clusters"][1]["nic_bandwidth"]["source"].startswith("default")
    finally:
        plugin_manager.set_plugin_manager(saved)
