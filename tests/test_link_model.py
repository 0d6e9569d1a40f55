"""The host-aware link model (hal.core.link_model) on bed-shaped topologies: the figures docs/performance.md
compares measurements with, for the 2 x 2 bed and for a sub-cluster spanning two hosts, where the
intra-sub-cluster steps that cross hosts are priced at the NIC rate. In-process, no ranks."""
import pytest

from hal.core.link_model import all_to_all_seconds, collective_seconds, traffic
from hal.core.topology import Topology, TopologyError
from hal.testbed import BedSpec

S = 16 * 2**20
B = 25e6   # 200 Mb/s


def _model(spec, op, algorithm):
    return collective_seconds(spec.topology(), op, algorithm, S) * B / S   # in units of S/B


def test_two_hosts_by_two_ranks():
    spec = BedSpec.of([2, 2], rate="200 Mb/s", chips=["cuda"] * 2 + ["ascend"] * 2)
    assert _model(spec, "all_reduce", "hetero") == pytest.approx(0.5)   # each rail carries S/n: S/(2B)
    assert _model(spec, "all_reduce", "gloo") == pytest.approx(1.5)     # ring: 2(W-1)/W S on an edge
    assert _model(spec, "all_to_all", "hetero") == pytest.approx(0.5)   # 2 remote blocks of S/4 per NIC
    assert _model(spec, "all_to_all", "gloo") == pytest.approx(0.5)


def test_a_sub_cluster_spanning_two_hosts_crosses_nics():
    """cuda on hosts 0 and 1 (one rank each), ascend on host 2: the cuda reduce-scatter and
    all_gather (S/2 each way each) and the relay hand-off now ride the NIC too."""
    spec = BedSpec.of_sub_clusters([("cuda", [1, 1]), ("ascend", [2])], rate="200 Mb/s")
    assert _model(spec, "all_reduce", "hetero") == pytest.approx(1.5)   # S/2 RS + S/2 rail + S/2 AG
    assert _model(spec, "all_reduce", "gloo") == pytest.approx(1.5)
    assert _model(spec, "all_to_all", "hetero") == pytest.approx(1.0)   # own 2 blocks + 2 relayed, S/4 each
    assert _model(spec, "all_to_all", "gloo") == pytest.approx(0.75)
    load = traffic(spec.topology(), "all_to_all", "hetero", S).per_resource()
    assert load["rank 0 nic_tx"] == pytest.approx(S) and load["rank 2 nic_tx"] == pytest.approx(S / 2)
    assert "rank 2 intra_tx" in load and "rank 0 intra_tx" not in load
    # the same chips with each sub-cluster on one node (no nodes given): the cuda steps are intra
    one_node = Topology.from_chips(["cuda", "cuda", "ascend", "ascend"], nic_bytes_per_s={"cuda": B, "ascend": B},
                                   intra_bytes_per_s=float("inf"))
    assert collective_seconds(one_node, "all_reduce", "hetero", S) * B / S == pytest.approx(0.5)


def test_uneven_rails_and_refusals():
    spec = BedSpec.of_sub_clusters([("cuda", [2, 1]), ("ascend", [1])], rate="200 Mb/s")   # 3+1 on 3 hosts
    # cuda ring 0-1-2 crosses host 0 -> host 1 -> host 0: 4/3 S; each of the 3 rails adds 1/3 S
    assert _model(spec, "all_reduce", "hetero") == pytest.approx(4 / 3 + 1 / 3)
    assert _model(spec, "all_to_all", "hetero") == pytest.approx(0.75)   # the lone rank: 3 of S/4 out
    # uneven all_to_all (a MoE exchange): only rank 0 sends, S to rank 3, relayed by rank 1 on 2 x 2
    two = BedSpec.of([2, 2], rate="200 Mb/s", chips=["cuda"] * 2 + ["ascend"] * 2).topology()
    one_block = [[0, 0, 0, S], [0] * 4, [0] * 4, [0] * 4]
    assert all_to_all_seconds(two, "hetero", one_block) * B / S == pytest.approx(1.0)
    with pytest.raises(TopologyError, match="4 x 4"):
        all_to_all_seconds(two, "hetero", [[0] * 4] * 3)
    with pytest.raises(TopologyError, match="op='broadcast'"):
        collective_seconds(spec.topology(), "broadcast", "hetero", S)
    with pytest.raises(TopologyError, match="algorithm='nccl'"):
        collective_seconds(spec.topology(), "all_reduce", "nccl", S)
