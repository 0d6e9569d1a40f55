"""What a test bed is made of: hosts (ranks per host), one NIC per rank, and each NIC's shaping.

    spec = BedSpec.of([2, 2], rate="200 Mb/s")                 # 2 hosts x 2 ranks, every NIC 200 Mb/s
    spec = BedSpec.from_cluster(load_cluster_spec(f), scale=1000, max_rate="400 Mb/s")
    spec = BedSpec.of_sub_clusters([("cuda", [2, 2]), ("ascend", [2])], rate="200 Mb/s")
                                   # cuda on hosts 0 and 1 (2 ranks each), ascend on host 2

A sub-cluster (one chip kind) may span several hosts (`of_sub_clusters`, or `chips` per global rank
with `of`): each of its ranks still has its own shaped NIC, its steps between hosts cross NICs, and
`topology()` gives the link model's view of the bed (hal.core.topology, hal.core.link_model).

A rate, delay and loss apply per NIC and per direction (a NIC's transmit queue on the host side, its
receive side on the switch port), like a real port's line rate. `from_cluster` takes the cluster
spec's node layout (torchrun node order, `hal.core.topology`) and each rank's `nic_bandwidth` divided by
`scale`, so a 400 Gb/s cluster becomes a 400 Mb/s bed at scale 1000: the bed keeps the ratios between
links, not their absolute speed (which this host's CPU could not carry).
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

from .errors import TestbedSpecError

# Private test range used only inside the bed's namespaces (never routed outside them).
DEFAULT_SUBNET = "10.213.0.0/16"
MAX_HOSTS = 32
MAX_RANKS_PER_HOST = 16


def parse_rate(value: Union[None, int, float, str]) -> Optional[float]:
    """Bits per second from 200e6, "200 Mb/s", "200mbit", "1 Gb/s", "25 MB/s" (bytes); None stays None."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        if value <= 0:
            raise TestbedSpecError(f"rate={value!r}: must be > 0 bits/s")
        return float(value)
    text = value.strip().replace(" ", "")
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "bit": 1.0,
             "b/s": 1.0}
    byte_units = {"KB/s": 8e3, "MB/s": 8e6, "GB/s": 8e9}
    for unit, mult in byte_units.items():
        if text.endswith(unit):
            return _positive(text[: -len(unit)], mult, value)
    for unit, mult in sorted(units.items(), key=lambda kv: -len(kv[0])):
        if text.lower().endswith(unit):
            return _positive(text[: -len(unit)], mult, value)
    return _positive(text, 1.0, value)


def _positive(number: str, mult: float, original) -> float:
    try:
        v = float(number) * mult
    except ValueError:
        raise TestbedSpecError(f"rate={original!r}: expected a number with a unit such as '200 Mb/s', "
                               f"'200mbit', '25 MB/s'") from None
    if v <= 0:
        raise TestbedSpecError(f"rate={original!r}: must be > 0")
    return v


@dataclass(frozen=True)
class LinkShape:
    """tc/iptables shaping of one NIC, both directions: rate (bits/s, tbf), loss (fraction, random
    drop), delay (ms, needs netem, which this kernel may lack: `Testbed.up` then says so)."""

    rate_bps: Optional[float] = None
    delay_ms: float = 0.0
    loss: float = 0.0
    queue_ms: float = 100.0   # tbf queue: the longest a packet waits behind the rate limit before a drop

    def __post_init__(self):
        if self.rate_bps is not None and self.rate_bps < 8e3:
            raise TestbedSpecError(f"rate_bps={self.rate_bps}: below 8 kbit/s, tbf cannot shape it usefully")
        if not 0.0 <= self.loss < 1.0:
            raise TestbedSpecError(f"loss={self.loss}: a fraction in [0, 1), e.g. 0.05 for 5%")
        if self.delay_ms < 0:
            raise TestbedSpecError(f"delay_ms={self.delay_ms}: must be >= 0")
        if not 1.0 <= self.queue_ms <= 1000.0:
            raise TestbedSpecError(f"queue_ms={self.queue_ms}: between 1 and 1000 ms")

    def describe(self) -> str:
        parts = [f"{self.rate_bps / 1e6:g} Mb/s" if self.rate_bps else "unshaped"]
        if self.delay_ms:
            parts.append(f"+{self.delay_ms:g} ms")
        if self.loss:
            parts.append(f"{self.loss * 100:g}% loss")
        return " ".join(parts)


@dataclass(frozen=True)
class BedSpec:
    """Hosts in torchrun node order; `ranks[h]` processes (and NICs) on host h; `links[h][i]` shapes
    host h's NIC i (the NIC of its local rank i)."""

    ranks: tuple[int, ...]
    links: tuple[tuple[LinkShape, ...], ...]
    subnet: str = DEFAULT_SUBNET
    shm_size: str = "1g"
    chips: tuple[str, ...] = field(default=())  # per global rank, for HAL_EMULATE (may be empty)

    def __post_init__(self):
        if not 1 <= len(self.ranks) <= MAX_HOSTS:
            raise TestbedSpecError(f"hosts={len(self.ranks)}: between 1 and {MAX_HOSTS}")
        for h, n in enumerate(self.ranks):
            if not 1 <= n <= MAX_RANKS_PER_HOST:
                raise TestbedSpecError(f"ranks[{h}]={n}: between 1 and {MAX_RANKS_PER_HOST} ranks per host")
        if len(self.links) != len(self.ranks) or any(len(l) != n for l, n in zip(self.links, self.ranks)):
            raise TestbedSpecError(f"links: need one LinkShape per rank per host, ranks={list(self.ranks)}, "
                                   f"links={[len(l) for l in self.links]}")
        net = ipaddress.ip_network(self.subnet)
        if net.version != 4 or not net.is_private or net.prefixlen > 16:
            raise TestbedSpecError(f"subnet={self.subnet!r}: a private IPv4 /16 or larger (e.g. 10.213.0.0/16)")
        if self.chips and len(self.chips) != self.world_size:
            raise TestbedSpecError(f"chips: {len(self.chips)} entries for a world of {self.world_size} ranks")

    @classmethod
    def of(cls, ranks: Sequence[int], rate: Union[None, float, str] = None, loss: float = 0.0,
           delay_ms: float = 0.0, chips: Sequence[str] = (), queue_ms: float = 100.0, **kw) -> "BedSpec":
        shape = LinkShape(rate_bps=parse_rate(rate), loss=loss, delay_ms=delay_ms, queue_ms=queue_ms)
        return cls(ranks=tuple(ranks), links=tuple(tuple(shape for _ in range(n)) for n in ranks),
                   chips=tuple(chips), **kw)

    @classmethod
    def from_cluster(cls, cluster, scale: float = 1000.0, max_rate: Union[None, float, str] = None,
                     **kw) -> "BedSpec":
        """One host per node of a `hal.core.cluster.ClusterSpec`, each rank's NIC at its sub-cluster's
        `nic_bandwidth` (spec, else catalog, see hal.core.topology) / `scale`, capped at `max_rate`."""
        if scale <= 0:
            raise TestbedSpecError(f"scale={scale}: must be > 0")
        from hal.core.topology import Topology
        topo = Topology.from_spec(cluster)
        cap = parse_rate(max_rate)
        per_node: dict[int, list[LinkShape]] = {}
        chips: list[str] = []
        for r in range(cluster.world_size):
            a = cluster.assignment(r)
            sc = next(s for s in topo.sub_clusters if r in s.ranks)
            bps = sc.nic_bandwidth.bytes_per_s * 8 / scale
            per_node.setdefault(a.node, []).append(LinkShape(rate_bps=min(bps, cap) if cap else bps))
            chips.append(a.chip)
        nodes = sorted(per_node)
        if nodes != list(range(len(nodes))):
            raise TestbedSpecError(f"cluster {cluster.name!r}: nodes {nodes} are not 0..{len(nodes) - 1}")
        return cls(ranks=tuple(len(per_node[n]) for n in nodes), links=tuple(tuple(per_node[n]) for n in nodes),
                   chips=tuple(chips), **kw)

    @classmethod
    def of_sub_clusters(cls, layout, rate: Union[None, float, str] = None, **kw) -> "BedSpec":
        """Hosts from a host list per sub-cluster: `[("cuda", [2, 2]), ("ascend", [2])]` (or a dict in
        that order) puts cuda on hosts 0 and 1 with 2 ranks each and ascend on host 2. Sub-clusters
        take hosts in order; a host holds one chip kind (as a server does). Other arguments as `of`."""
        pairs = list(layout.items()) if isinstance(layout, dict) else list(layout)
        if not pairs:
            raise TestbedSpecError("of_sub_clusters: no sub-clusters given (layout = [])")
        ranks: list[int] = []
        chips: list[str] = []
        for entry in pairs:
            if not (isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[0], str)):
                raise TestbedSpecError(f"of_sub_clusters: entry {entry!r}: expected (chip, [ranks per host])")
            chip, hosts = entry
            hosts = [hosts] if isinstance(hosts, int) else list(hosts)
            if not hosts or not all(isinstance(n, int) for n in hosts):
                raise TestbedSpecError(f"of_sub_clusters: {chip!r}: hosts={hosts!r}, expected a list of rank "
                                       f"counts per host such as [2, 2]")
            ranks += hosts
            chips += [chip] * sum(hosts)
        return cls.of(ranks, rate=rate, chips=chips, **kw)

    def host_of(self, rank: int) -> int:
        """The host of global rank `rank` (torchrun node order)."""
        if not 0 <= rank < self.world_size:
            raise TestbedSpecError(f"rank={rank}: the bed has ranks 0..{self.world_size - 1}")
        h = 0
        while rank >= self.first_rank(h) + self.ranks[h]:
            h += 1
        return h

    def sub_cluster_hosts(self) -> dict[str, list[int]]:
        """chip -> the hosts its ranks are on, in order ({} without chips)."""
        out: dict[str, list[int]] = {}
        for r, chip in enumerate(self.chips):
            hosts = out.setdefault(chip, [])
            if self.host_of(r) not in hosts:
                hosts.append(self.host_of(r))
        return out

    def topology(self, intra_bytes_per_s: float = float("inf")):
        """The bed as a `hal.core.topology.Topology` for the link model: one sub-cluster per chip kind
        (emulated), each rank on its host, each rank's NIC at its shaped rate (the slowest NIC of a
        sub-cluster, unshaped counted as unbounded). Inside a host the bed's ranks talk over shared
        memory or loopback, which is not shaped: `intra_bytes_per_s` defaults to unbounded (free next
        to the links)."""
        if not self.chips:
            raise TestbedSpecError("topology(): the spec has no chips (give chips=[...] or use of_sub_clusters)")
        from hal.core.topology import Topology
        nic: dict[str, float] = {}
        for r, chip in enumerate(self.chips):
            h = self.host_of(r)
            rate = self.links[h][r - self.first_rank(h)].rate_bps
            bps = rate / 8 if rate else float("inf")
            nic[chip] = min(nic.get(chip, bps), bps)
        return Topology.from_chips(list(self.chips), nodes=[self.host_of(r) for r in range(self.world_size)],
                                   nic_bytes_per_s=nic, intra_bytes_per_s=intra_bytes_per_s)

    def route_nic(self, host: int, remote_rank: int) -> int:
        """The NIC of `host` that reaches global rank `remote_rank` (on another host) for a socket that
        binds no source address. With chips: the NIC of the first local rank that shares one of the
        bridge's rails with it (hal.core.topology), so each rail rides its members' own NICs also
        where rail peers have different local indices (a sub-cluster spanning hosts, uneven hosts);
        otherwise, and without chips, rail-matched by index: remote NIC j from local NIC j mod n."""
        g = self.host_of(remote_rank)
        j, n, first = remote_rank - self.first_rank(g), self.ranks[host], self.first_rank(host)
        if self.chips:
            for rail in self._rails():
                if remote_rank in rail:
                    local = [r for r in rail if first <= r < first + n]
                    if local:
                        return local[0] - first
        return j % n

    def _rails(self) -> list[list[int]]:
        from hal.core.topology import rail_layout
        return [list(r.members) for r in rail_layout([(c, True) for c in self.chips]).rails]

    @property
    def world_size(self) -> int:
        return sum(self.ranks)

    @property
    def hosts(self) -> int:
        return len(self.ranks)

    def first_rank(self, host: int) -> int:
        return sum(self.ranks[:host])

    def address(self, host: int, nic: int) -> str:
        """Host h's NIC i: subnet + (h+1)*256 + i+1, e.g. 10.213.1.1 for host 0 NIC 0."""
        net = ipaddress.ip_network(self.subnet)
        return str(net.network_address + (host + 1) * 256 + nic + 1)

    @property
    def prefixlen(self) -> int:
        return ipaddress.ip_network(self.subnet).prefixlen

    def describe(self) -> list[str]:
        out = []
        for h, n in enumerate(self.ranks):
            r0 = self.first_rank(h)
            nics = ", ".join(f"rail{i} {self.address(h, i)} {self.links[h][i].describe()}" for i in range(n))
            out.append(f"host {h}: ranks {r0}-{r0 + n - 1}: {nics}")
        return out
