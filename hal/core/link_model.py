"""The link-bound model of a collective on a topology that knows its nodes: seconds at link rate alone.

    from hal.core.link_model import collective_seconds
    collective_seconds(topo, "all_reduce", "hetero", size_bytes)   # the bridge's algorithm
    collective_seconds(topo, "all_to_all", "gloo", size_bytes)     # flat gloo over every rank
    all_to_all_seconds(topo, "hetero", matrix)                     # matrix[s][d]: bytes s sends to d

What it counts: every byte the algorithm moves between two ranks (payload only, no headers), put on
the link `Topology.link(a, b)` prices: a rank pair on one node of one sub-cluster uses that
sub-cluster's intra-node fabric; any other pair -- different nodes, *including two ranks of one
sub-cluster that spans nodes*, or two chip kinds -- goes out of the sender's NIC and into the
receiver's NIC. Each rank has one NIC, full duplex (send and receive are separate resources at the
sub-cluster's `nic_bandwidth` each way); each rank's intra fabric likewise. The time is the busiest
resource's bytes / its rate: the steps are assumed perfectly overlapped (the bridge pipelines an
all_reduce's chunks; an all_to_all's steps run concurrently), there is no latency term, no switch
contention beyond the end ports (a non-blocking switch), and each socket leaves on its own rank's
NIC (rail-aligned routes, as `hal.testbed` sets them up). So it is a lower bound on time: a
measurement reaches at best about 95% of it over TCP at MTU 1500 (headers).

Algorithms, S = the per-rank message in bytes:
- all_reduce, `hetero` (rail path, `hal.ccl_bridge`): in each sub-cluster of n ranks a ring
  reduce-scatter and a ring all_gather of S (rank order), each rank sending (n-1)/n S to its ring
  successor in each; on every rail, a ring all_reduce of the rail's parts (S * parts/m) over its
  members (2(L-1)/L of that per member, L members).
- all_reduce, `gloo`: one ring over all W ranks in rank order, 2(W-1)/W S per edge.
- all_to_all, `hetero`: S/W per (source, destination) pair; a pair inside one sub-cluster goes
  direct; a cross pair goes to its relay (the member of `cross_rail`'s rail in the source's
  sub-cluster, when that is not the source) and then along the rail to the destination.
- all_to_all, `gloo`: S/W per pair, direct.
Sizes that do not divide are treated as real numbers (the model is a bandwidth figure).
"""
from __future__ import annotations

from collections import defaultdict

from .topology import Topology, TopologyError, cross_rail

OPS = ("all_reduce", "all_to_all")
ALGORITHMS = ("hetero", "gloo")


class _Load:
    """Bytes per resource: ("nic_tx"|"nic_rx"|"intra_tx"|"intra_rx", rank) -> bytes."""

    def __init__(self, topo: Topology):
        self.topo = topo
        self.bytes: dict[tuple[str, int], float] = defaultdict(float)

    def move(self, a: int, b: int, nbytes: float) -> None:
        if a == b or nbytes <= 0:
            return
        kind = "intra" if self._intra(a, b) else "nic"
        self.bytes[(f"{kind}_tx", a)] += nbytes
        self.bytes[(f"{kind}_rx", b)] += nbytes

    def _intra(self, a: int, b: int) -> bool:
        t = self.topo
        return t.sub_cluster_of(a) is t.sub_cluster_of(b) and t.node_of(a) == t.node_of(b)

    def seconds(self) -> float:
        worst = 0.0
        for (kind, rank), nbytes in self.bytes.items():
            sc = self.topo.sub_cluster_of(rank)
            rate = (sc.intra_bandwidth if kind.startswith("intra") else sc.nic_bandwidth).bytes_per_s
            worst = max(worst, nbytes / rate)
        return worst

    def per_resource(self) -> dict[str, float]:
        return {f"rank {r} {k}": v for (k, r), v in sorted(self.bytes.items(), key=lambda kv: (kv[0][1], kv[0][0]))}


def _ring(load: _Load, ranks: list[int], nbytes_per_edge: float) -> None:
    for i, r in enumerate(ranks):
        load.move(r, ranks[(i + 1) % len(ranks)], nbytes_per_edge)


def traffic(topo: Topology, op: str, algorithm: str, size_bytes: float) -> _Load:
    """The bytes every resource carries for one collective (see the module docstring)."""
    if op not in OPS:
        raise TopologyError(f"link model: op={op!r}, expected one of {OPS}")
    if algorithm not in ALGORITHMS:
        raise TopologyError(f"link model: algorithm={algorithm!r}, expected one of {ALGORITHMS}")
    if size_bytes < 0:
        raise TopologyError(f"link model: size_bytes={size_bytes}, must be >= 0")
    load, W, S = _Load(topo), topo.world_size, float(size_bytes)
    lay = topo.layout
    if op == "all_reduce" and (algorithm == "gloo" or lay.single_chip):
        _ring(load, list(range(W)), 2 * (W - 1) / W * S)
    elif op == "all_reduce":
        if not lay.rail_mode:
            raise TopologyError(f"link model: {lay.parts} parts exceed max_parts; the leader-only bridge "
                                f"paths are not modelled")
        for g in lay.subclusters:
            _ring(load, list(g.ranks), 2 * (g.size - 1) / g.size * S)   # reduce-scatter + all_gather
        for rail in lay.rails:
            share, L = S * (rail.end_part - rail.first_part) / lay.parts, len(rail.members)
            _ring(load, list(rail.members), 2 * (L - 1) / L * share)
    else:
        _all_to_all(load, algorithm, [[S / W] * W for _ in range(W)])
    return load


def _all_to_all(load: _Load, algorithm: str, matrix) -> None:
    lay = load.topo.layout
    W = lay.world_size
    for s in range(W):
        for d in range(W):
            nbytes = float(matrix[s][d])
            if algorithm == "gloo" or lay.single_chip or lay.cluster_of[s] == lay.cluster_of[d]:
                load.move(s, d, nbytes)
                continue
            if not lay.rail_mode:
                raise TopologyError(f"link model: {lay.parts} parts exceed max_parts; the leader-only "
                                    f"all_to_all is not modelled")
            relay = lay.rails[cross_rail(lay, s, d)].members[lay.cluster_of[s]]
            load.move(s, relay, nbytes)
            load.move(relay, d, nbytes)


def collective_seconds(topo: Topology, op: str, algorithm: str, size_bytes: float) -> float:
    """Seconds for one `op` of `size_bytes` per rank at link rate alone (the busiest resource)."""
    return traffic(topo, op, algorithm, size_bytes).seconds()


def all_to_all_seconds(topo: Topology, algorithm: str, matrix) -> float:
    """Seconds for one all_to_all where rank s sends `matrix[s][d]` bytes to rank d (uneven splits,
    e.g. a MoE token exchange), at link rate alone."""
    W = topo.world_size
    if algorithm not in ALGORITHMS:
        raise TopologyError(f"link model: algorithm={algorithm!r}, expected one of {ALGORITHMS}")
    if len(matrix) != W or any(len(row) != W for row in matrix):
        raise TopologyError(f"link model: the all_to_all matrix must be {W} x {W} (one row and column per "
                            f"rank), got {[len(row) for row in matrix]}")
    load = _Load(topo)
    _all_to_all(load, algorithm, matrix)
    return load.seconds()
