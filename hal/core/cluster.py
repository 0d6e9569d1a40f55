"""The cluster spec: a TOML file listing sub-clusters (chip, nodes, ranks per node, links), and the
rank-to-chip assignment that matches torchrun's rank order.

    name = "h800-910b-32"
    [[sub_clusters]]
    name = "nvidia"          # unique; also the sub-cluster's process-group name
    chip = "cuda"            # a chip name a plugin provides
    model = "H800"           # optional: a hal.core.catalog model (key, alias or device name)
    nodes = 2
    ranks_per_node = 8
    intra_bandwidth = "200 GB/s"   # optional override, per direction (number = bytes/s)
    nic_bandwidth = "400 Gb/s"     # optional override, per direction
    memory = "80 GB"         # optional: memory per device, overrides the catalog (e.g. a 32 GB 910B4)
    emulate = false          # optional: run this sub-cluster's ranks emulated on CPU
    colocate = false         # optional: share the previous sub-cluster's single node (see below)

Rank order (the assumption every user of `assignment()` relies on): torchrun gives each node's
workers a contiguous block of global ranks, in node order (`_assign_worker_ranks` in
torch/distributed/elastic/agent/server/api.py: base rank = sum of the local world sizes of the
agents before it). So launch the nodes of a sub-cluster contiguously, with node_rank in the order
the sub-clusters are listed, each node with `--nproc-per-node` = that sub-cluster's
ranks_per_node, using a rendezvous that keeps node_rank (torchrun's default `static` backend with
`--node-rank`; c10d rendezvous orders nodes by arrival instead). Then global rank r belongs to the
first sub-cluster whose cumulative rank count exceeds r.

`colocate = true` puts a sub-cluster on the previous sub-cluster's node, after its ranks (one
torchrun with `--nproc-per-node` = their sum, as on a laptop running emulated chips). Only
single-node sub-clusters may colocate: with several nodes torchrun would interleave the two
sub-clusters' ranks node by node, and a sub-cluster's ranks would no longer be contiguous.

Errors are `hal.ClusterSpecError` naming the file, the field path, the value and the TOML line.
"""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, field_validator

from hal.contract.errors import ClusterSpecError, UnknownChipError, field_path, value_at

MAX_NODES = 100_000
MAX_RANKS_PER_NODE = 1024
_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?\d+)?)\s*([KMGT]?)([Bb])/s\s*$")


def parse_bandwidth(value: Union[int, float, str]) -> float:
    """`"200 GB/s"` -> 2e11 bytes/s; `"400 Gb/s"` -> 5e10 bytes/s; a number is bytes/s."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a bandwidth")
    if isinstance(value, (int, float)):
        return float(value)
    m = _RATE.match(str(value))
    if not m:
        raise ValueError(f"{value!r} is not a bandwidth; write bytes/s as a number or e.g. '200 GB/s', '400 Gb/s'")
    number, prefix, unit = float(m.group(1)), m.group(2).upper(), m.group(3)
    scale = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}[prefix]
    return number * scale / (8.0 if unit == "b" else 1.0)


_BYTES = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?\d+)?)\s*([KMGT]?)(i?)B\s*$")


def parse_bytes(value: Union[int, float, str]) -> float:
    """`"32 GB"` -> 32e9 bytes; `"96 GiB"` -> 96 * 2**30; a number is bytes."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size in bytes")
    if isinstance(value, (int, float)):
        return float(value)
    m = _BYTES.match(str(value))
    if not m:
        raise ValueError(f"{value!r} is not a size; write bytes as a number or e.g. '32 GB', '96 GiB'")
    power = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}[m.group(2).upper()]
    return float(m.group(1)) * ((1024 if m.group(3) else 1000) ** power)


class SubCluster(BaseModel):
    """Ranks that share one chip kind and one vendor CCL fabric."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    chip: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    # Upper bounds far above any real machine, so a typo fails at once instead of laying out 1e8 ranks.
    nodes: int = Field(ge=1, le=MAX_NODES, description="number of nodes (hosts) in this sub-cluster")
    ranks_per_node: int = Field(ge=1, le=MAX_RANKS_PER_NODE,
                                description="processes per node (torchrun --nproc-per-node)")
    model: Optional[str] = Field(default=None, description="chip model, a hal.core.catalog key or alias")
    intra_bandwidth: Optional[float] = Field(default=None, gt=0, description="intra-fabric bytes/s per direction")
    nic_bandwidth: Optional[float] = Field(default=None, gt=0, description="NIC bytes/s per direction per rank")
    memory: Optional[float] = Field(default=None, gt=0, description="memory bytes per device (e.g. '32 GB'); "
                                    "overrides the catalog's figure for the model (a 32 GB 910B4)")
    emulate: StrictBool = False  # `emulate = "yes"` is refused, not taken as true
    colocate: StrictBool = Field(default=False, description="run on the previous sub-cluster's (single) node")

    @field_validator("intra_bandwidth", "nic_bandwidth", mode="before")
    @classmethod
    def _rate(cls, v: Any) -> Any:
        return None if v is None else parse_bandwidth(v)

    @field_validator("memory", mode="before")
    @classmethod
    def _size(cls, v: Any) -> Any:
        return None if v is None else parse_bytes(v)

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node


@dataclass(frozen=True)
class RankAssignment:
    """Where one global rank sits: its chip, its sub-cluster and its place in it."""

    rank: int
    chip: str
    emulated: bool
    model: Optional[str]
    sub_cluster: str        # the sub-cluster's name
    local_index: int        # index of this rank inside its sub-cluster
    node: int               # global node index (torchrun node_rank)
    local_rank: int         # index on its node (torchrun LOCAL_RANK)


class ClusterSpec(BaseModel):
    """A mixed cluster: sub-clusters in torchrun node order."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = ""
    description: str = ""
    sub_clusters: list[SubCluster] = Field(min_length=1)
    source: Optional[str] = Field(default=None, exclude=True, description="file it was loaded from")

    @property
    def world_size(self) -> int:
        return sum(s.world_size for s in self.sub_clusters)

    @property
    def chips(self) -> list[str]:
        """Chip names in sub-cluster order, without repeats."""
        return list(dict.fromkeys(s.chip for s in self.sub_clusters))

    def sub_cluster(self, name: str) -> SubCluster:
        for s in self.sub_clusters:
            if s.name == name:
                return s
        raise KeyError(f"no sub-cluster {name!r}; sub-clusters: {[s.name for s in self.sub_clusters]}")

    def ranks_of(self, name: str) -> range:
        """Global ranks of a sub-cluster (contiguous, see the module docstring)."""
        start = 0
        for s in self.sub_clusters:
            if s.name == name:
                return range(start, start + s.world_size)
            start += s.world_size
        raise KeyError(f"no sub-cluster {name!r}; sub-clusters: {[s.name for s in self.sub_clusters]}")

    def assignment(self, rank: int) -> RankAssignment:
        """Chip and place of global `rank` in torchrun order."""
        if not 0 <= rank < self.world_size:
            raise ClusterSpecError(f"{self.source or 'cluster spec'}: rank {rank} is outside the world of "
                                   f"{self.world_size} ranks ({self._sizes()})")
        first_rank = 0
        for s, (first_node, offset) in zip(self.sub_clusters, self._placements()):
            if rank < first_rank + s.world_size:
                local_index = rank - first_rank
                return RankAssignment(rank=rank, chip=s.chip, emulated=s.emulate, model=s.model,
                                      sub_cluster=s.name, local_index=local_index,
                                      node=first_node + local_index // s.ranks_per_node,
                                      local_rank=offset + local_index % s.ranks_per_node)
            first_rank += s.world_size
        raise AssertionError("unreachable: rank checked against world_size")

    @property
    def num_nodes(self) -> int:
        """Hosts in the cluster (colocated sub-clusters share theirs)."""
        return sum(s.nodes for s in self.sub_clusters if not s.colocate)

    def _placements(self) -> list[tuple[int, int]]:
        """(first node, first local rank on it) of each sub-cluster."""
        out: list[tuple[int, int]] = []
        next_node = 0
        for s in self.sub_clusters:
            if s.colocate and out:
                node, offset = out[-1]
                prev = self.sub_clusters[len(out) - 1]
                out.append((node, offset + prev.ranks_per_node))
            else:
                out.append((next_node, 0))
                next_node += s.nodes
        return out

    def describe(self) -> dict:
        return {"name": self.name, "source": self.source, "world_size": self.world_size,
                "sub_clusters": [dict(s.model_dump(), ranks=[self.ranks_of(s.name)[0], self.ranks_of(s.name)[-1]])
                                 for s in self.sub_clusters]}

    def _sizes(self) -> str:
        return " + ".join(f"{s.name}: {s.nodes} x {s.ranks_per_node}" for s in self.sub_clusters)

    def subset(self, names: Iterable[str]) -> "ClusterSpec":
        """This cluster with only the sub-clusters `names` (kept in spec order, ranks renumbered from 0, as a
        job launched on their nodes alone numbers them); a kept sub-cluster that colocated with a dropped
        one gets its node back. ClusterSpecError for a name the spec lacks or an empty selection."""
        want = list(dict.fromkeys(names))
        known = [s.name for s in self.sub_clusters]
        bad = [n for n in want if n not in known]
        if bad or not want:
            what = f"sub-cluster(s) {bad} not in this cluster" if bad else "no sub-cluster(s) selected"
            err = ClusterSpecError(f"{self.source or 'cluster spec'}: {what}; sub-clusters: {known}")
            err.source, err.field = self.source or "cluster spec", "sub_clusters"
            err.value, err.line = ",".join(want), None
            raise err
        kept, prev_kept = [], False
        for s in self.sub_clusters:
            if s.name in want:
                kept.append(s if prev_kept or not s.colocate else s.model_copy(update={"colocate": False}))
            prev_kept = s.name in want
        return self.model_copy(update={"sub_clusters": kept,
                                       "name": f"{self.name or 'cluster'} ({', '.join(s.name for s in kept)})"})


# ---- loading ---------------------------------------------------------------------------------
def load_cluster_spec(path: Union[str, Path], pm: Any = None) -> ClusterSpec:
    """Read and validate a cluster spec file. With a plugin manager `pm`, chip names are checked
    against the chips its plugins provide; model names are checked against `hal.core.catalog`."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ClusterSpecError(f"{path}: cannot read cluster spec: {exc}") from exc
    return parse_cluster_spec(text, str(path), known_chips=None if pm is None else list(pm.chips))


def parse_cluster_spec(text: str, source: str = "<string>",
                       known_chips: Optional[Iterable[str]] = None) -> ClusterSpec:
    """Validate cluster-spec TOML text; `source` names it in errors."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"at line (\d+)", str(exc))
        err = ClusterSpecError(f"{source}{':' + m.group(1) if m else ''}: not valid TOML: {exc}")
        err.source, err.field, err.value, err.line = source, None, None, int(m.group(1)) if m else None
        raise err from exc
    lines = _key_lines(text)
    try:
        spec = ClusterSpec(**data, source=source)
    except ValidationError as exc:
        problems = [_pydantic_problem(source, lines, data, e) for e in exc.errors()]
        # One error carrying every problem (one per line); its attributes are the first problem's.
        err = ClusterSpecError("\n".join(str(p) for p in problems))
        err.source, err.field, err.value, err.line = (problems[0].source, problems[0].field,
                                                      problems[0].value, problems[0].line)
        raise err from None
    except TypeError as exc:  # e.g. sub_clusters given as a table, not an array of tables
        raise ClusterSpecError(f"{source}: {exc}") from exc
    _check_consistency(spec, source, lines, known_chips)
    return spec


def _check_consistency(spec: ClusterSpec, source: str, lines: dict, known_chips: Optional[Iterable[str]]) -> None:
    seen: dict[str, int] = {}
    for i, s in enumerate(spec.sub_clusters):
        if s.colocate:
            if i == 0:
                raise _problem(source, lines, ("sub_clusters", i, "colocate"), True,
                               "the first sub-cluster has no previous sub-cluster to share a node with")
            prev = spec.sub_clusters[i - 1]
            if s.nodes != 1 or prev.nodes != 1:
                raise _problem(source, lines, ("sub_clusters", i, "colocate"), True,
                               f"only single-node sub-clusters can share a node: this one has nodes = {s.nodes}, "
                               f"the previous ({prev.name!r}) nodes = {prev.nodes}; with more nodes torchrun "
                               f"would interleave their ranks node by node")
        if s.name in seen:
            raise _problem(source, lines, ("sub_clusters", i, "name"), s.name,
                           f"duplicate sub-cluster name (also sub_clusters[{seen[s.name]}])")
        seen[s.name] = i
    known = None if known_chips is None else sorted(known_chips)
    for i, s in enumerate(spec.sub_clusters):
        if known is not None and s.chip not in known:
            raise _problem(source, lines, ("sub_clusters", i, "chip"), s.chip,
                           f"no registered plugin provides this chip; known chips: {known}")
        if s.model is not None:
            from hal.core import catalog
            if s.chip in catalog.chips():
                try:
                    catalog.get(s.chip, s.model)
                except UnknownChipError as exc:
                    raise _problem(source, lines, ("sub_clusters", i, "model"), s.model, str(exc)) from None


def _problem(source: str, lines: dict, loc: tuple, value: Any, problem: str) -> ClusterSpecError:
    line = _line_of(lines, loc)
    where = f"{source}:{line}" if line else source
    err = ClusterSpecError(f"{where}: {field_path(loc)} = {value!r}: {problem}")
    err.source, err.field, err.value, err.line = source, field_path(loc), value, line
    return err


def _pydantic_problem(source: str, lines: dict, data: dict, e: Mapping[str, Any]) -> ClusterSpecError:
    loc = tuple(e["loc"])
    value = e.get("input", value_at(data, loc))
    problem = e["msg"]
    if e["type"] == "missing":
        value, problem = None, "required field is missing"
    elif e["type"] == "extra_forbidden":
        problem = "unknown field; allowed here: " + _allowed(loc)
    elif loc and loc[-1] in ("nodes", "ranks_per_node") and e["type"] == "greater_than_equal":
        problem = f"{problem} (got {value}; a sub-cluster needs at least 1 node and 1 rank per node)"
    elif loc and loc[-1] in ("nodes", "ranks_per_node") and e["type"] == "less_than_equal":
        problem = f"{problem} (got {value}; the limit is far above any real machine: a typo?)"
    elif e["type"] == "bool_type":
        problem = "must be a TOML boolean: true or false, without quotes"
    return _problem(source, lines, loc, value, problem)


def _allowed(loc: tuple) -> str:
    model = SubCluster if "sub_clusters" in loc[:-1] else ClusterSpec
    return ", ".join(k for k in model.model_fields if k != "source")


def _line_of(lines: dict, loc: tuple) -> Optional[int]:
    """Line of the key `loc` names; else of its table's header (e.g. a missing key)."""
    loc = tuple(loc)
    while loc:
        if loc in lines:
            return lines[loc]
        loc = loc[:-1]
    return None


_HEADER = re.compile(r"^\s*(\[\[?)\s*([A-Za-z0-9_.\"' -]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"^\s*([A-Za-z0-9_\"'.-]+)\s*=")


def _key_lines(text: str) -> dict[tuple, int]:
    """Map (table path..., key) -> 1-based line, scanning the text: `[[x]]` counts array entries,
    `[x.y]` opens a table, `key =` inside the current table. Good enough for cluster specs."""
    out: dict[tuple, int] = {}
    counts: dict[tuple, int] = {}
    current: tuple = ()
    for n, line in enumerate(text.splitlines(), start=1):
        m = _HEADER.match(line)
        if m:
            parts = tuple(p.strip().strip("\"'") for p in m.group(2).split("."))
            if m.group(1) == "[[":
                counts[parts] = counts.get(parts, -1) + 1
                current = parts + (counts[parts],)
            else:
                current = parts
            out.setdefault(current, n)
            continue
        k = _KEY.match(line)
        if k:
            key = tuple(p.strip().strip("\"'") for p in k.group(1).split("."))
            out.setdefault(current + key, n)
    return out
