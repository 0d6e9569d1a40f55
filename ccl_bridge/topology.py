"""Who is where in a `hetero` group: sub-clusters from the ranks' chip identities, and the rails.

Sub-clusters. Ranks with the same chip *and* the same emulated flag share one vendor CCL fabric (an
emulated chip's fabric is the CPU one, so it cannot share a group with a native chip of the same
name). Sub-clusters are ordered by their lowest rank; inside one, ranks keep group-rank order, and a
rank's position there is its *index*.

Rails, and the home of a part (how uneven sub-clusters are handled). A message is cut into
`m = lcm(n_0, ..., n_{k-1})` equal *parts* (n_c = size of sub-cluster c). In sub-cluster c every rank
owns `q_c = m / n_c` consecutive parts: index i owns parts [i*q_c, (i+1)*q_c) -- it is their *home*.
This is exactly the shard an intra reduce-scatter of the m-part buffer leaves on that rank, so no
extra copy is needed. The rail of part j is the set of its homes, one rank per sub-cluster (in
sub-cluster order); consecutive parts with the same homes share one rail (one gloo group). So:

- 2+2: m=2, rails {0,2} (part 0) and {1,3} (part 1): the classic rails, each rank forwards 1/2.
- 3+1: m=3, rails {0,3}, {1,3}, {2,3}: the lone rank 3 is home of every part and sits on all three
  rails; it forwards its whole sub-cluster's data, as it must (it is the only rank there).
- 2+1+1: m=2, rails {0,2,3} (part 0) and {1,2,3} (part 1).
- 4+2: m=4, q=(1,2): rails {0,4}, {1,4}, {2,5}, {3,5}.

Every rank is home of at least one part, so every rank is on at least one rail, and the rail of
part 0 (every sub-cluster's index 0) is the *leader rail* used by the small-message paths. The homes
of consecutive parts only ever step forward, so there are at most W - k + 1 rails (W ranks, k
sub-clusters). The part count m itself can be large for sizes with little in common (97+64:
m = 6208), and the rail algorithms cost O(k*m) slice copies per call and pad messages to m
elements; above `max_parts` the topology keeps only the leader rail (`rail_mode` False) and large
collectives take leader or global-group paths: correct, slower, and said so in `describe()`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence


@dataclass(frozen=True)
class RankIdentity:
    """What a rank tells the others at group creation."""

    chip: str
    emulated: bool
    device_type: str
    host: str
    ccl_backend: str = ""

    @property
    def key(self) -> tuple[str, bool]:
        return (self.chip, self.emulated)

    def label(self) -> str:
        return f"{self.chip}{' (emulated)' if self.emulated else ''}"

    def to_dict(self) -> dict:
        return {"chip": self.chip, "emulated": self.emulated, "device_type": self.device_type,
                "host": self.host, "ccl_backend": self.ccl_backend}

    @classmethod
    def from_dict(cls, d: dict) -> "RankIdentity":
        return cls(chip=str(d["chip"]), emulated=bool(d["emulated"]), device_type=str(d["device_type"]),
                   host=str(d["host"]), ccl_backend=str(d.get("ccl_backend", "")))


@dataclass(frozen=True)
class SubCluster:
    index: int
    chip: str
    emulated: bool
    ranks: tuple[int, ...]  # group ranks, ascending

    @property
    def size(self) -> int:
        return len(self.ranks)

    def label(self) -> str:
        return f"sub-cluster {self.index} ({self.chip}{', emulated' if self.emulated else ''}, " \
               f"ranks {list(self.ranks)})"


@dataclass(frozen=True)
class Rail:
    index: int
    members: tuple[int, ...]  # one group rank per sub-cluster, in sub-cluster order
    homes: tuple[int, ...]    # each member's index inside its sub-cluster
    first_part: int
    end_part: int             # parts [first_part, end_part)

    @property
    def nparts(self) -> int:
        return self.end_part - self.first_part

    def label(self) -> str:
        return f"rail {self.index} (ranks {list(self.members)}, parts {self.first_part}..{self.end_part - 1})"


@dataclass(frozen=True)
class Topology:
    identities: tuple[RankIdentity, ...]
    subclusters: tuple[SubCluster, ...]
    cluster_of: tuple[int, ...]        # per group rank: its sub-cluster index
    index_in_cluster: tuple[int, ...]  # per group rank: its index inside the sub-cluster
    parts: int                         # m; in leader-only mode still lcm for reference
    rails: tuple[Rail, ...]
    rail_mode: bool
    _rails_of: tuple[tuple[int, ...], ...] = field(repr=False, default=())

    @property
    def world_size(self) -> int:
        return len(self.identities)

    @property
    def k(self) -> int:
        return len(self.subclusters)

    @property
    def single_chip(self) -> bool:
        return self.k == 1

    def parts_per_rank(self, cluster: int) -> int:
        """q_c: parts each rank of sub-cluster `cluster` is home of."""
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

    def leader_of(self, cluster: int) -> int:
        return self.subclusters[cluster].ranks[0]

    def describe(self) -> dict:
        return {"subclusters": [{"chip": s.chip, "emulated": s.emulated, "ranks": list(s.ranks)}
                                for s in self.subclusters],
                "parts": self.parts, "rail_mode": self.rail_mode,
                "rails": [{"members": list(r.members), "parts": [r.first_part, r.end_part]}
                          for r in self.rails]}


def _lcm(values: Sequence[int]) -> int:
    out = 1
    for v in values:
        out = out * v // math.gcd(out, v)
    return out


def build_topology(identities: Sequence[RankIdentity], max_parts: int = 256) -> Topology:
    """Sub-clusters and rails for ranks 0..len(identities)-1 (see the module docstring)."""
    if not identities:
        raise ValueError("a hetero group needs at least one rank")
    order: list[tuple[str, bool]] = []
    members: dict[tuple[str, bool], list[int]] = {}
    for rank, ident in enumerate(identities):
        if ident.key not in members:
            order.append(ident.key)
            members[ident.key] = []
        members[ident.key].append(rank)
    subclusters = tuple(SubCluster(i, key[0], key[1], tuple(members[key])) for i, key in enumerate(order))
    cluster_of = [0] * len(identities)
    index_in = [0] * len(identities)
    for sc in subclusters:
        for i, r in enumerate(sc.ranks):
            cluster_of[r], index_in[r] = sc.index, i
    sizes = [sc.size for sc in subclusters]
    m = _lcm(sizes)
    q = [m // n for n in sizes]
    rails: list[Rail] = []
    rail_mode = len(subclusters) > 1 and m <= max_parts
    if rail_mode:
        start = 0
        homes_prev: Optional[tuple[int, ...]] = None
        for j in range(m + 1):
            homes = tuple(j // qc for qc in q) if j < m else None
            if homes != homes_prev:
                if homes_prev is not None:
                    mem = tuple(subclusters[c].ranks[h] for c, h in enumerate(homes_prev))
                    rails.append(Rail(len(rails), mem, homes_prev, start, j))
                start, homes_prev = j, homes
    if len(subclusters) > 1 and not rail_mode:
        # Leader-only: the rail of every sub-cluster's index 0, and nothing else.
        homes = tuple(0 for _ in subclusters)
        rails = [Rail(0, tuple(sc.ranks[0] for sc in subclusters), homes, 0, m)]
    rails_of: list[list[int]] = [[] for _ in identities]
    for rail in rails:
        for r in rail.members:
            rails_of[r].append(rail.index)
    return Topology(identities=tuple(identities), subclusters=subclusters, cluster_of=tuple(cluster_of),
                    index_in_cluster=tuple(index_in), parts=m, rails=tuple(rails), rail_mode=rail_mode,
                    _rails_of=tuple(tuple(x) for x in rails_of))
