"""The one topology of a mixed cluster: sub-clusters, nodes, ranks, rails and link bandwidths.

    from hal.core.topology import Topology
    topo = Topology.from_spec(spec)                      # a hal.core.cluster.ClusterSpec
    topo = Topology.from_chips(["cuda", "cuda", "ascend", "ascend"])   # HAL_EMULATE-style
    topo = Topology.from_env()                           # HAL_EMULATE, else HAL_CLUSTER
    topo.sub_clusters[0].ranks, topo.chip_of(3), topo.node_of(3), topo.rails
    topo.sub_clusters[0].nic_bandwidth   # Link(bytes_per_s=5e10, source="spec")

Every user of "sub-cluster" and "rail" takes them from here: the `hetero` bridge (ccl_bridge builds
its `RailLayout` with `rail_layout` from the chip identities the ranks exchange at run time),
`hal cluster show`, the strategies and the planner. A spec's rails: `Topology.from_spec(spec).rails`.

Sub-clusters and CCL groups. A spec's sub-clusters are what the user wrote (name, chip, model,
nodes). The bridge groups ranks by (chip, emulated) -- ranks with the same chip kind share one vendor
CCL fabric -- so the rails are computed over those *chip groups*. They equal the spec's sub-clusters
unless two spec entries have the same chip and emulate flag (say H100 and H800 both `cuda`): then
both share one chip group and one set of rails, exactly as the bridge will run them.

Rails, and the home of a part (how uneven chip groups are handled). A message is cut into
`m = lcm(n_0, ..., n_{k-1})` equal *parts* (n_c = size of chip group c). In group c every rank owns
`q_c = m / n_c` consecutive parts: index i owns parts [i*q_c, (i+1)*q_c) -- it is their *home*. The
rail of part j is the set of its homes, one rank per group (in group order); consecutive parts with
the same homes share one rail. So:

- 2+2: m=2, rails [0,2] (part 0) and [1,3] (part 1): the classic rails.
- 3+1: m=3, rails [0,3], [1,3], [2,3]: the lone rank 3 is home of every part and sits on all three
  rails; it forwards its whole group's data, as it must (it is the only rank there).
- 2+1+1: m=2, rails [0,2,3] (part 0) and [1,2,3] (part 1).
- 4+2: m=4, q=(1,2): rails [0,4], [1,4], [2,5], [3,5].

Every rank is home of at least one part, so every rank is on at least one rail, and the rail of
part 0 (every group's index 0) is the *leader rail*. Homes only step forward, so there are at most
W - k + 1 rails. The part count can be large for sizes with little in common (97+64: m = 6208); above
`max_parts` (the bridge's HAL_BRIDGE_MAX_PARTS, default `DEFAULT_MAX_PARTS`) only the leader rail is
kept (`rail_mode` False) and large collectives take leader or global-group paths.

Link figures. Each sub-cluster's `intra_bandwidth` (inside a node: NVLink, HCCS) and `nic_bandwidth`
(per rank, to other nodes) are a `Link(bytes_per_s, source)`: the spec's value (source "spec"), else
the catalog profile of the spec's model or the chip's default model (source "catalog:<model>"), else
a stated default (`DEFAULT_INTRA`, `DEFAULT_NIC`; source "default: ..."), never left empty, so the
planner always has a number and can say where it came from. A rail crosses nodes, so its bandwidth is
the slowest NIC among its members (`rail_bandwidth`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, NamedTuple, Optional, Sequence

from hal import envs
from hal.contract.errors import HalError
from hal.core.cluster import ClusterSpec, load_cluster_spec

DEFAULT_MAX_PARTS = envs.HAL_BRIDGE_MAX_PARTS.default
# Stated defaults for a figure neither the spec nor the catalog gives (e.g. Ascend HCCS, any NIC the
# catalog marks cluster-dependent). Chosen as common, conservative hardware, not measured.
DEFAULT_INTRA = 25e9   # bytes/s per direction: a PCIe 4.0 x16 host link (~32 GB/s raw, ~25 GB/s usable)
DEFAULT_NIC = 12.5e9   # bytes/s per direction: one 100 Gb/s Ethernet/RoCE port per rank
_DEFAULT_INTRA_SOURCE = "default: 25 GB/s, a PCIe 4.0 x16 host link (not in spec or catalog)"
_DEFAULT_NIC_SOURCE = "default: 12.5 GB/s, one 100 Gb/s port per rank (not in spec or catalog)"


class TopologyError(HalError, ValueError):
    """A topology cannot be built from what was given; the message names the value and the numbers."""


class Link(NamedTuple):
    """One link figure: bytes/s per direction and where the number comes from."""

    bytes_per_s: float
    source: str  # "spec", "catalog:<model>", or "default: ..."


# ---- rails over chip groups (the bridge runs exactly this) -------------------------------------
@dataclass(frozen=True)
class ChipGroup:
    """Ranks that share one chip kind and emulated flag, hence one vendor CCL fabric."""

    index: int
    chip: str
    emulated: bool
    ranks: tuple[int, ...]  # ascending

    @property
    def size(self) -> int:
        return len(self.ranks)

    def label(self) -> str:
        return f"sub-cluster {self.index} ({self.chip}{', emulated' if self.emulated else ''}, " \
               f"ranks {list(self.ranks)})"


@dataclass(frozen=True)
class Rail:
    index: int
    members: tuple[int, ...]  # one rank per chip group, in group order
    homes: tuple[int, ...]    # each member's index inside its group
    first_part: int
    end_part: int             # parts [first_part, end_part)

    def label(self) -> str:
        return f"rail {self.index} (ranks {list(self.members)}, parts {self.first_part}..{self.end_part - 1})"


@dataclass(frozen=True)
class RailLayout:
    """Chip groups, parts and rails over ranks 0..W-1 (the bridge's group ranks)."""

    subclusters: tuple[ChipGroup, ...]
    cluster_of: tuple[int, ...]        # per rank: its chip group
    index_in_cluster: tuple[int, ...]  # per rank: its index inside the group
    parts: int                         # m; in leader-only mode still the lcm, for reference
    rails: tuple[Rail, ...]
    rail_mode: bool
    _rails_of: tuple[tuple[int, ...], ...] = field(repr=False, default=())

    @property
    def world_size(self) -> int:
        return len(self.cluster_of)

    @property
    def k(self) -> int:
        return len(self.subclusters)

    @property
    def single_chip(self) -> bool:
        return self.k == 1

    def parts_per_rank(self, cluster: int) -> int:
        """q_c: parts each rank of chip group `cluster` is home of."""
        return self.parts // self.subclusters[cluster].size

    def rails_of(self, rank: int) -> list[Rail]:
        """The rails `rank` sits on, in part order."""
        return [self.rails[i] for i in self._rails_of[rank]]

    @property
    def leader_rail(self) -> Rail:
        return self.rails[0]

    def rail_with(self, rank: int) -> Optional[Rail]:
        """The first rail that has `rank` as a member (None in leader-only mode for a non-leader)."""
        ids = self._rails_of[rank]
        return self.rails[ids[0]] if ids else None

    def describe(self) -> dict:
        return {"subclusters": [{"chip": s.chip, "emulated": s.emulated, "ranks": list(s.ranks)}
                                for s in self.subclusters],
                "parts": self.parts, "rail_mode": self.rail_mode,
                "rails": [{"members": list(r.members), "parts": [r.first_part, r.end_part]}
                          for r in self.rails]}


def load_spec_for_world(path: str, world_size: Optional[int], error: type[Exception] = ValueError,
                        world_name: str = "world_size") -> ClusterSpec:
    """The cluster spec at `path` (HAL_CLUSTER's); `error` when `world_size` is given (as `world_name`)
    and is not the spec's world size."""
    spec = load_cluster_spec(path)
    if world_size is not None and world_size != spec.world_size:
        raise error(f"cluster spec {path} has world size {spec.world_size} but {world_name} is {world_size}")
    return spec


def _lcm(values: Sequence[int]) -> int:
    out = 1
    for v in values:
        out = out * v // math.gcd(out, v)
    return out


def rail_layout(keys: Sequence[tuple[str, bool]], max_parts: int = DEFAULT_MAX_PARTS) -> RailLayout:
    """Chip groups and rails for ranks 0..len(keys)-1, where keys[r] = (chip, emulated) of rank r.
    Groups are ordered by their lowest rank; inside one, ranks keep rank order."""
    if not keys:
        raise TopologyError("a topology needs at least one rank (got an empty rank list)")
    if max_parts < 1:
        raise TopologyError(f"max_parts = {max_parts}: must be >= 1")
    order: list[tuple[str, bool]] = []
    members: dict[tuple[str, bool], list[int]] = {}
    for rank, key in enumerate(keys):
        key = (str(key[0]), bool(key[1]))
        if key not in members:
            order.append(key)
            members[key] = []
        members[key].append(rank)
    groups = tuple(ChipGroup(i, key[0], key[1], tuple(members[key])) for i, key in enumerate(order))
    cluster_of = [0] * len(keys)
    index_in = [0] * len(keys)
    for g in groups:
        for i, r in enumerate(g.ranks):
            cluster_of[r], index_in[r] = g.index, i
    sizes = [g.size for g in groups]
    m = _lcm(sizes)
    q = [m // n for n in sizes]
    rails: list[Rail] = []
    rail_mode = len(groups) > 1 and m <= max_parts
    if rail_mode:
        start = 0
        homes_prev: Optional[tuple[int, ...]] = None
        for j in range(m + 1):
            homes = tuple(j // qc for qc in q) if j < m else None
            if homes != homes_prev:
                if homes_prev is not None:
                    mem = tuple(groups[c].ranks[h] for c, h in enumerate(homes_prev))
                    rails.append(Rail(len(rails), mem, homes_prev, start, j))
                start, homes_prev = j, homes
    if len(groups) > 1 and not rail_mode:
        # Leader-only: the rail of every group's index 0, and nothing else.
        rails = [Rail(0, tuple(g.ranks[0] for g in groups), tuple(0 for _ in groups), 0, m)]
    rails_of: list[list[int]] = [[] for _ in keys]
    for rail in rails:
        for r in rail.members:
            rails_of[r].append(rail.index)
    return RailLayout(subclusters=groups, cluster_of=tuple(cluster_of), index_in_cluster=tuple(index_in),
                      parts=m, rails=tuple(rails), rail_mode=rail_mode,
                      _rails_of=tuple(tuple(x) for x in rails_of))


def cross_rail(topo: RailLayout, s: int, d: int) -> int:
    """Index of the rail that carries the bridge's all_to_all block s -> d, for ranks in different
    chip groups (O(rails of d)): a rail with d on which s sits, else one of d's rails picked by s's
    index in its group, so a group's sources spread over d's rails (hal.ccl_bridge.alltoall)."""
    cs = topo.cluster_of[s]
    cand = topo.rails_of(d)
    for r in cand:
        if r.members[cs] == s:
            return r.index
    return cand[topo.index_in_cluster[s] % len(cand)].index


# ---- link figures ---------------------------------------------------------------------------------
def links_for(chip: str, model: Optional[str], intra: Optional[float] = None,
              nic: Optional[float] = None) -> tuple[Link, Link]:
    """(intra, nic) links: the given override, else the catalog profile (`model`, else the chip's
    default model), else the stated default."""
    from hal.core import catalog
    prof = None
    if chip in catalog.chips():
        prof = catalog.profile_for(chip, model)
    out = []
    for override, name, default, dsrc in ((intra, "intra_node_bandwidth", DEFAULT_INTRA, _DEFAULT_INTRA_SOURCE),
                                          (nic, "nic_bandwidth", DEFAULT_NIC, _DEFAULT_NIC_SOURCE)):
        fig = getattr(prof, name) if prof is not None else None
        if override is not None:
            out.append(Link(float(override), "spec"))
        elif prof is not None and fig is not None and fig.known:
            out.append(Link(float(fig.value), f"catalog:{prof.model}"))
        else:
            out.append(Link(default, dsrc))
    return out[0], out[1]


# ---- the topology ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class SubClusterTopo:
    """One sub-cluster: its chip, model, global ranks, ranks per node, and link figures."""

    name: str
    chip: str
    model: Optional[str]
    ranks: list[int]           # global ranks, ascending
    nodes: list[list[int]]     # ranks of each of its nodes, in node order
    emulated: bool
    intra_bandwidth: Link
    nic_bandwidth: Link
    node_ids: list[int] = field(default_factory=list)  # global node index of each entry of `nodes`

    @property
    def size(self) -> int:
        return len(self.ranks)

    def describe(self) -> dict:
        return {"name": self.name, "chip": self.chip, "model": self.model, "ranks": list(self.ranks),
                "nodes": [list(n) for n in self.nodes], "node_ids": list(self.node_ids),
                "emulated": self.emulated,
                "intra_bandwidth": {"bytes_per_s": self.intra_bandwidth.bytes_per_s,
                                    "source": self.intra_bandwidth.source},
                "nic_bandwidth": {"bytes_per_s": self.nic_bandwidth.bytes_per_s,
                                  "source": self.nic_bandwidth.source}}


@dataclass(frozen=True)
class Topology:
    """Sub-clusters of a world, every rank's chip and node, and the bridge's rails over it."""

    sub_clusters: list[SubClusterTopo]
    layout: RailLayout
    name: str = ""
    source: Optional[str] = None
    _sc_of: tuple[int, ...] = field(repr=False, default=())
    _node_of: tuple[int, ...] = field(repr=False, default=())

    # ---- builders ---------------------------------------------------------------------------------
    @classmethod
    def from_spec(cls, spec: ClusterSpec, max_parts: int = DEFAULT_MAX_PARTS) -> "Topology":
        """From a `hal.core.cluster.ClusterSpec` (torchrun rank order, see hal.core.cluster)."""
        scs = []
        for s in spec.sub_clusters:
            ranks = list(spec.ranks_of(s.name))
            per_node: dict[int, list[int]] = {}
            for r in ranks:
                per_node.setdefault(spec.assignment(r).node, []).append(r)
            intra, nic = links_for(s.chip, s.model, s.intra_bandwidth, s.nic_bandwidth)
            scs.append(SubClusterTopo(name=s.name, chip=s.chip, model=s.model, ranks=ranks,
                                      nodes=list(per_node.values()), emulated=s.emulate,
                                      intra_bandwidth=intra, nic_bandwidth=nic, node_ids=list(per_node)))
        return cls._build(scs, max_parts, name=spec.name, source=spec.source)

    @classmethod
    def from_chips(cls, chips: Sequence[str], emulated: bool = True, models: Optional[Mapping[str, str]] = None,
                   max_parts: int = DEFAULT_MAX_PARTS, nodes: Optional[Sequence[int]] = None,
                   nic_bytes_per_s: Optional[Mapping[str, float]] = None,
                   intra_bytes_per_s: Optional[float] = None) -> "Topology":
        """From the chip of every rank (HAL_EMULATE order): one sub-cluster per chip, named after it,
        ordered by its lowest rank. Without `nodes` each sub-cluster is one node of its own; with
        `nodes` (the node of every rank, e.g. a test bed's hosts) a sub-cluster may span several nodes
        and share none or some with others. `models` maps chip -> catalog model for the link figures
        (default: the catalog's default model of the chip); `nic_bytes_per_s` (chip -> bytes/s) and
        `intra_bytes_per_s` override them (source "spec")."""
        if not chips:
            raise TopologyError("from_chips: no ranks given (chips = [])")
        if nodes is not None and len(nodes) != len(chips):
            raise TopologyError(f"from_chips: nodes has {len(nodes)} entries for {len(chips)} ranks")
        by_chip: dict[str, list[int]] = {}
        for r, c in enumerate(chips):
            by_chip.setdefault(str(c), []).append(r)
        scs = []
        for i, (chip, ranks) in enumerate(by_chip.items()):
            model = (models or {}).get(chip)
            intra, nic = links_for(chip, model, intra_bytes_per_s, (nic_bytes_per_s or {}).get(chip))
            per_node: dict[int, list[int]] = {}
            for r in ranks:
                per_node.setdefault(i if nodes is None else int(nodes[r]), []).append(r)
            scs.append(SubClusterTopo(name=chip, chip=chip, model=model, ranks=ranks,
                                      nodes=list(per_node.values()), emulated=emulated, intra_bandwidth=intra,
                                      nic_bandwidth=nic, node_ids=list(per_node)))
        return cls._build(scs, max_parts)

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None, world_size: Optional[int] = None,
                 max_parts: Optional[int] = None) -> "Topology":
        """The topology the ranks of this launch will have: HAL_EMULATE (with counts), else the
        HAL_CLUSTER spec (the same precedence as `hal.accelerator()`); max_parts from
        HAL_BRIDGE_MAX_PARTS like the bridge."""
        if max_parts is None:
            max_parts = envs.HAL_BRIDGE_MAX_PARTS.get(env, error=TopologyError)
        emulate = envs.HAL_EMULATE.text(env)
        if emulate:
            from hal.emulation.emulate import emulated_ranks, parse_emulate_map
            chips = emulated_ranks(emulate, world_size)
            if chips is None:
                if world_size is None:
                    raise TopologyError(f"HAL_EMULATE={emulate!r} names one chip for every rank; pass world_size")
                chips = [parse_emulate_map(emulate)[0][0]] * world_size
            return cls.from_chips(chips, emulated=True, max_parts=max_parts)
        path = envs.HAL_CLUSTER.text(env)
        if path:
            return cls.from_spec(load_spec_for_world(path, world_size, TopologyError), max_parts=max_parts)
        raise TopologyError("no topology in the environment: set HAL_EMULATE (e.g. 'cuda:2,ascend:2') or "
                            "HAL_CLUSTER (a cluster spec file)")

    @classmethod
    def _build(cls, scs: list[SubClusterTopo], max_parts: int, name: str = "",
               source: Optional[str] = None) -> "Topology":
        world = sum(s.size for s in scs)
        sc_of = [-1] * world
        node_of = [-1] * world
        for i, s in enumerate(scs):
            for ids, ranks in zip(s.node_ids, s.nodes):
                for r in ranks:
                    if not 0 <= r < world or sc_of[r] != -1:
                        raise TopologyError(f"sub-cluster {s.name!r}: rank {r} is outside 0..{world - 1} or "
                                            f"already in another sub-cluster")
                    sc_of[r], node_of[r] = i, ids
        keys = [(scs[sc_of[r]].chip, scs[sc_of[r]].emulated) for r in range(world)]
        return cls(sub_clusters=list(scs), layout=rail_layout(keys, max_parts), name=name, source=source,
                   _sc_of=tuple(sc_of), _node_of=tuple(node_of))

    # ---- queries ----------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return len(self._sc_of)

    @property
    def num_nodes(self) -> int:
        return len(set(self._node_of))

    @property
    def chips(self) -> list[str]:
        """Chip names in sub-cluster order, without repeats."""
        return list(dict.fromkeys(s.chip for s in self.sub_clusters))

    def _check(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise TopologyError(f"rank {rank} is outside the world of {self.world_size} ranks "
                                f"({' + '.join(f'{s.name}: {s.size}' for s in self.sub_clusters)})")

    def sub_cluster_of(self, rank: int) -> SubClusterTopo:
        self._check(rank)
        return self.sub_clusters[self._sc_of[rank]]

    def chip_of(self, rank: int) -> str:
        return self.sub_cluster_of(rank).chip

    def node_of(self, rank: int) -> int:
        """Global node index (torchrun node_rank for a spec; one node per sub-cluster from chips)."""
        self._check(rank)
        return self._node_of[rank]

    def sub_cluster(self, name: str) -> SubClusterTopo:
        for s in self.sub_clusters:
            if s.name == name:
                return s
        raise TopologyError(f"no sub-cluster {name!r}; sub-clusters: {[s.name for s in self.sub_clusters]}")

    @property
    def rails(self) -> list[list[int]]:
        """Global ranks of each rail (the bridge's rails over the whole world)."""
        return [list(r.members) for r in self.layout.rails]

    def rail_bandwidth(self, rail: int) -> Link:
        """A rail crosses nodes: its bandwidth is the slowest NIC among its members."""
        members = self.layout.rails[rail].members
        return min((self.sub_cluster_of(r).nic_bandwidth for r in members), key=lambda link: link.bytes_per_s)

    def link(self, a: int, b: int) -> Link:
        """The link between two ranks: the sub-cluster's intra link on one node of one sub-cluster,
        else the slower of the two NICs."""
        sa, sb = self.sub_cluster_of(a), self.sub_cluster_of(b)
        if sa is sb and self.node_of(a) == self.node_of(b):
            return sa.intra_bandwidth
        return min(sa.nic_bandwidth, sb.nic_bandwidth, key=lambda link: link.bytes_per_s)

    def group_layout(self, ranks: Sequence[int], max_parts: int = DEFAULT_MAX_PARTS) -> RailLayout:
        """The rail layout the bridge builds for a `hetero` subgroup over global `ranks` (group
        ranks are positions in `ranks`)."""
        for r in ranks:
            self._check(r)
        return rail_layout([(self.chip_of(r), self.sub_cluster_of(r).emulated) for r in ranks], max_parts)

    def describe(self) -> dict:
        return {"name": self.name, "source": self.source, "world_size": self.world_size,
                "nodes": self.num_nodes, "sub_clusters": [s.describe() for s in self.sub_clusters],
                "parts": self.layout.parts, "rail_mode": self.layout.rail_mode, "rails": self.rails}
