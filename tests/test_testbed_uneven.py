"""The bridge across three emulated hosts with uneven ranks, built from a cluster spec: host 0 runs
2 emulated cuda ranks (400 Gb/s NICs), host 1 one kunlun, host 2 one ascend (200 Gb/s), scaled by
1000 to 400/200 Mb/s tbf-shaped NICs. Every rank takes its chip from the spec (HAL_CLUSTER) by its
global rank, as on a real cluster; torchrun's static rendezvous gives host h the spec's node h.
One job: identity (spec rank order, shm only inside host 0, gloo rails), a reduced collective matrix
over the 2+1+1 rails ([0, 2, 3] and [1, 2, 3]). Needs root (skips otherwise).
"""
import subprocess

import pytest

from hal.core.cluster import parse_cluster_spec
from hal.core.topology import Topology
from hal.testbed import BedSpec

from ._testbed_fixture import make_bed_fixture, run_cases

pytestmark = pytest.mark.slow

SPEC_TOML = """
name = "testbed-3-uneven"
[[sub_clusters]]
name = "h100"
chip = "cuda"
model = "H100"
nodes = 1
ranks_per_node = 2
nic_bandwidth = "400 Gb/s"
emulate = true

[[sub_clusters]]
name = "p800"
chip = "kunlun"
nodes = 1
ranks_per_node = 1
nic_bandwidth = "200 Gb/s"
emulate = true

[[sub_clusters]]
name = "910b"
chip = "ascend"
nodes = 1
ranks_per_node = 1
nic_bandwidth = "200 Gb/s"
emulate = true
"""
CLUSTER = parse_cluster_spec(SPEC_TOML, "testbed-3-uneven.toml")
WALL = 150.0
MATRIX = [
    ("all_reduce+reduce", ["float32", "bfloat16"], ["sum", "max"], [7, 70_000]),
    ("reduce_scatter", ["float32"], ["sum"], [8, 70_000]),
    ("all_gather", ["float32"], ["sum"], [5, 70_000]),
    ("all_to_all", ["float32"], ["sum"], [8, 70_000]),
]

bed = make_bed_fixture(lambda: BedSpec.from_cluster(CLUSTER, scale=1000))


def test_spec_layout_and_shaping(bed):
    assert bed.spec.ranks == (2, 1, 1)
    for h, want in ((0, "400Mbit"), (1, "200Mbit"), (2, "200Mbit")):
        out = subprocess.run(["tc", "-n", bed.netns(h), "qdisc", "show", "dev", "rail0"],
                             capture_output=True, text=True).stdout
        assert "tbf" in out and f"rate {want}" in out, (h, out)


@pytest.fixture(scope="module")
def job(bed, tmp_path_factory):
    path = tmp_path_factory.mktemp("spec") / "testbed-3-uneven.toml"
    path.write_text(SPEC_TOML)
    cases = [["identity"], ["tests._bridge_cases:setup", 60.0]]
    cases += [["tests._bridge_cases:matrix", c, d, o, s] for c, d, o, s in MATRIX]
    result, per_rank = run_cases(bed, cases, 60.0, WALL, env={"HAL_CLUSTER": str(path)})
    assert result.ok and sorted(per_rank) == [0, 1, 2, 3], f"{result.describe()}\n{result.tail()}"
    for r, recs in per_rank.items():
        for rec in recs:
            assert rec["ok"], f"rank {r} {rec['case']}: {rec.get('error_type')}: {rec.get('error')}\n{rec.get('traceback')}"
    return per_rank


def test_ranks_follow_the_cluster_spec(bed, job):
    ids = {r: job[r][0]["value"] for r in range(4)}
    for r in range(4):
        a = CLUSTER.assignment(r)
        assert (ids[r]["chip"], ids[r]["node_rank"]) == (a.chip, a.node), (r, ids[r], a)
        assert ids[r]["hostname"] == bed.hostname(a.node) and ids[r]["emulated"]
    # shm only where a sub-cluster has several ranks on one host (host 0); single-rank groups have none
    assert [ids[r]["intra_pg"] for r in range(4)] == ["ShmProcessGroup", "ShmProcessGroup", None, None]
    assert [sorted(ids[r]["rails"]) for r in range(4)] == [["0"], ["1"], ["0", "1"], ["0", "1"]]
    rails = ids[0]["topology"]["rails"]
    assert [rl["members"] for rl in rails] == [[0, 2, 3], [1, 2, 3]] == Topology.from_spec(CLUSTER).rails


@pytest.mark.parametrize("i,coll", [(2 + i, c[0]) for i, c in enumerate(MATRIX)])
def test_bridge_matrix_uneven_hosts(job, i, coll):
    total = 0
    for r in range(4):
        v = job[r][i]["value"]
        assert not v["failures"], f"rank {r} {coll}: {v['failures'][:10]}"
        total += v["checks"]
    assert total > 0


SPAN = "cuda:3,ascend:1"   # HAL_EMULATE over the spec's chips: cuda on hosts 0 (2 ranks) and 1 (1 rank)


def test_sub_cluster_spanning_two_hosts(bed):
    """One more job on this bed with cuda spanning hosts 0 and 1 and ascend on host 2 (3+1): the cuda
    sub-cluster's CCL crosses host 0 -> host 1 NICs (HAL_CPU_CCL=auto: gloo, since its ranks are on
    two hosts), its rails reach the lone ascend rank from both hosts; all_reduce (int32, exact) and
    all_to_all (exact copies) across it match the reference on every rank."""
    cases = [["identity"], ["tests._bridge_cases:setup", 60.0],
             ["tests._bridge_cases:matrix", "all_reduce+reduce", ["int32"], ["sum"], [7, 70_000]],
             ["tests._bridge_cases:matrix", "all_to_all", ["float32"], ["sum"], [8, 70_000]]]
    result, per_rank = run_cases(bed, cases, 60.0, WALL, env={"HAL_EMULATE": SPAN})
    assert result.ok and sorted(per_rank) == [0, 1, 2, 3], f"{result.describe()}\n{result.tail()}"
    for r, recs in per_rank.items():
        for rec in recs:
            assert rec["ok"], f"rank {r} {rec['case']}: {rec.get('error_type')}: {rec.get('error')}"
    ids = {r: per_rank[r][0]["value"] for r in range(4)}
    assert [(ids[r]["chip"], ids[r]["node_rank"]) for r in range(4)] == [
        ("cuda", 0), ("cuda", 0), ("cuda", 1), ("ascend", 2)], ids
    assert [ids[r]["intra_pg"] for r in range(4)] == ["StridedSafeGloo"] * 3 + [None], ids
    assert [rl["members"] for rl in ids[0]["topology"]["rails"]] == [[0, 3], [1, 3], [2, 3]]
    for i in (2, 3):
        v = [per_rank[r][i]["value"] for r in range(4)]
        assert all(not x["failures"] and x["rail_mode"] for x in v), v
        assert sum(x["checks"] for x in v) > 0
