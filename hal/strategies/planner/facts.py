"""The figures the planner reasons with, per sub-cluster, each with where it came from.

Order of preference for every figure: a measured efficiency matrix (`hal conformance --level perf
--efficiency FILE`, passed as `--matrix DIR`), then the chip's catalog profile, then a stated
default. Link figures come from `hal.core.topology` (spec, else catalog, else its stated default: one
definition), scaled by the efficiency matrix's link fractions. Nothing is silent: `ChipFacts.sources` names the
origin of each number and `hal plan` prints them.

What a chip sustains comes from its efficiency matrix (hal.core.chip_matrix: the catalog's
`[efficiency.*]` tables, each figure sourced; a measured matrix replaces the GEMM curve and the memory
fraction): `flops` is the best sustained rate (peak x the matrix's best fraction, the upper bound's
rate), the cost model rates each GEMM and attention by the matrix, `memory_bw` and the links are the
catalog/topology figures x the matrix's fractions, and `memory` is what a plan may use: the capacity
(spec `memory`, else catalog) less the matrix's reserve and fragmentation. Figures the catalog lists as
unknown (for example every Kunlun P800 peak) get the values in ASSUMED, each with the reason.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

# The chip figures the planner shares with timed emulation are defined once: the efficiency matrices
# (hal.core.chip_matrix, catalog), and in hal.emulation.timed_cost ASSUMED (figures the catalog lists
# as unknown) and DEFAULT_MEMORY_BW, so a plan for emulated chips and the emulated chips agree.
from hal.emulation.timed_cost import ASSUMED, DEFAULT_MEMORY_BW  # noqa: E402
from hal.core.chip_matrix import ChipMatrix  # noqa: E402

DEFAULT_MEMORY = (64e9, "default: 64 GB")
# Host staging for the bridge's cross-chip path: device<->host copies per rank (PCIe Gen4/5 x16,
# about 25 GB/s achieved each way).
DEFAULT_HOST_COPY_BW = (25e9, "default: PCIe x16 device<->host 25 GB/s")


@dataclass(frozen=True)
class ChipFacts:
    """One sub-cluster's figures (per device) as the planner uses them."""

    name: str                 # sub-cluster name
    chip: str                 # chip name (cuda, ascend, kunlun, cpu)
    model: str                # chip model, e.g. H100
    ranks: tuple[int, ...]    # global ranks, in order
    ranks_per_node: int
    flops: float              # achieved dense matmul FLOP/s (bf16) per device
    peak: float               # peak dense FLOP/s (bf16) per device: the MFU denominator
    memory: float             # bytes per device
    memory_bw: float          # bytes/s
    intra_bw: float           # achieved bytes/s per device inside a node (TP, intra CCL)
    nic_bw: float             # achieved bytes/s per rank across nodes (rails, DP across nodes)
    host_copy_bw: float       # bytes/s device<->host (bridge staging)
    sources: dict[str, str] = field(default_factory=dict)
    # seconds per message on a link (the alpha of alpha-beta costs): 0 for catalog/spec links (large
    # messages, where bandwidth dominates); measured on the host for timed emulation's CPU fabric
    link_latency: float = 0.0
    # per-rank bandwidth of the bridge's rails across sub-clusters: hal.core.topology's
    # Topology.rail_bandwidth (the slowest NIC among a rail's members) x the NIC fraction, set by
    # `with_rails`; None: this sub-cluster's own NIC (a caller without the topology)
    rail_bw: Optional[float] = None
    # the chip efficiency matrix the cost model rates GEMMs and attention with (None: every op at `flops`)
    matrix: Optional[ChipMatrix] = None
    # bytes per device before the reserve (`memory` is what a plan may use of it); 0: same as memory
    capacity: float = 0.0

    @property
    def size(self) -> int:
        return len(self.ranks)

    def describe(self) -> list[tuple[str, str, str]]:
        """(figure, value, source) rows for the report."""
        def g(x: float, unit: str) -> str:
            for div, p in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
                if x >= div:
                    return f"{x / div:.3g} {p}{unit}"
            return f"{x:.3g} {unit}"
        return [("best sustained bf16 FLOP/s", g(self.flops, "FLOP/s"), self.sources["flops"]),
                ("usable memory", g(self.memory, "B"), self.sources["memory"]),
                ("memory bandwidth", g(self.memory_bw, "B/s"), self.sources["memory_bw"]),
                ("intra-node link", g(self.intra_bw, "B/s"), self.sources["intra_bw"]),
                ("NIC per rank", g(self.nic_bw, "B/s"), self.sources["nic_bw"]),
                ("device<->host copy", g(self.host_copy_bw, "B/s"), self.sources["host_copy_bw"])] + \
            ([("rail across sub-clusters", g(self.rail_bw, "B/s"), self.sources["rail_bw"])] if self.rail_bw else [])


def _catalog_profile(chip: str, model: Optional[str]):
    from hal.core import catalog
    try:
        return catalog.get(chip, model) if model else catalog.default(chip)
    except Exception:  # an unknown chip (cpu, a vendor's own) has no catalog entry
        return None


def load_matrices(directory: Optional[str | Path]) -> dict[str, Any]:
    """Efficiency matrices in `directory` (`*.json` written by the perf level, validated by
    `hal.core.efficiency`), keyed by chip name and by profile model: (matrix, file)."""
    if directory is None:
        return {}
    from hal.core.efficiency import load_efficiency_matrix
    d = Path(directory)
    if not d.is_dir():
        raise FileNotFoundError(f"--matrix {d}: not a directory of efficiency matrices")
    out: dict[str, Any] = {}
    for f in sorted(d.glob("*.json")):
        try:
            m = load_efficiency_matrix(f)
        except Exception as exc:   # pydantic's ValidationError or bad JSON: name the file
            raise ValueError(f"{f}: not an efficiency matrix: {str(exc).splitlines()[0]}") from None
        out[m.chip] = (m, str(f))
        out[m.profile_model] = (m, str(f))
    return out


def neutral_matrix(chip: str, model: str) -> ChipMatrix:
    """The matrix of a chip the catalog has none for (cpu, a vendor's own): every op class at the best
    rate, links and memory as given, no reserve. Measured figures (--matrix) are used as they are."""
    why = "no catalog efficiency matrix for this chip: figures used as measured/given"
    return ChipMatrix(chip=chip, model=model, gemm_peak=1.0, gemm_half_dim=1.0, attention=1.0, memory=1.0,
                      intra_link=1.0, nic_link=1.0, intra_latency_s=0.0, nic_latency_s=0.0,
                      memory_reserve_bytes=0.0, memory_fragmentation=0.0, sources={"all": why}, origin=why)


def catalog_matrix(chip: str, model: Optional[str]) -> Optional[ChipMatrix]:
    from hal.core import catalog
    try:
        return catalog.matrix(chip, model)
    except Exception:  # a chip the catalog lacks
        return None


def chip_facts(sc, matrices: Optional[dict[str, dict]] = None, dtype: str = "bfloat16",
               memory: Optional[float] = None) -> ChipFacts:
    """Figures for one sub-cluster (`hal.core.topology.SubClusterTopo`); `memory`: its capacity per device
    from the cluster spec (hal.core.cluster.SubCluster.memory), else the catalog's."""
    name, chip, model = sc.name, sc.chip, sc.model
    prof = _catalog_profile(chip, model)
    model_key = model or (prof.model if prof else chip)
    assumed = {}
    for key, table in ASSUMED.items():
        if (model and key.lower() == str(model).lower()) or (prof is not None and key in prof.model):
            assumed = table
    src: dict[str, str] = {}
    m, mfile = (matrices or {}).get(model_key) or (matrices or {}).get(chip) or (None, "")
    cm = catalog_matrix(chip, model) if prof is not None else None
    cm = cm or neutral_matrix(chip, str(model_key))
    peak = prof.peak(dtype) if prof else None
    peak_src = f"catalog {prof.model} {dtype} peak" if peak and prof else ""
    if not peak and "peak_bf16" in assumed:
        peak, peak_src = assumed["peak_bf16"][0], assumed["peak_bf16"][1]
    cat_bw = prof.memory_bandwidth.value if prof is not None else None
    if m is not None and m.best_matmul_flops(dtype):
        peak = peak or m.best_matmul_flops(dtype)
        cm = cm.with_measured(m, peak, cat_bw or m.memory_bytes_per_s(), mfile)
    if not peak:
        raise ValueError(f"sub-cluster {name!r}: chip {chip} model {model_key!r} has no {dtype} peak in the "
                         f"catalog and no measured efficiency matrix; pass --matrix DIR with one")
    flops = cm.best_fraction * peak
    sus = (f"; includes x {cm.sustained:.3g}, the chip's sustained share of its short-run rate (the matrix's "
           f"`sustained`; its source in the catalog)" if cm.sustained < 1 else "")
    if m is not None and m.best_matmul_flops(dtype):
        src["flops"] = f"measured: {mfile} (best {dtype} matmul" + (", EMULATED host" if m.emulated else "") + \
            f", {cm.best_fraction:.3g} of peak; the GEMM curve is its points{sus})"
    else:
        src["flops"] = (f"{cm.best_fraction:.3g} (best GEMM fraction, efficiency matrix {cm.origin}) x "
                        f"{peak_src or 'peak'} {peak / 1e12:.0f} TFLOP/s{sus}")

    def pick(fieldname: str, catalog_attr: str, default: tuple[float, str]) -> float:
        fig = getattr(prof, catalog_attr) if prof is not None else None
        if fig is not None and fig.value is not None:
            src[fieldname] = f"catalog {prof.model}"
            return fig.value
        if fieldname in assumed:
            v, why = assumed[fieldname]
            src[fieldname] = why
            return v
        v, why = default
        src[fieldname] = why
        return v

    if memory is not None:
        capacity = memory
        src["memory"] = "cluster spec"
    else:
        capacity = pick("memory", "memory_bytes", DEFAULT_MEMORY)
    src["memory"] += (f" {capacity / 1e9:.0f} GB less {cm.memory_fragmentation:.0%} fragmentation and "
                      f"{cm.memory_reserve_bytes / 1e9:.1f} GB reserve (efficiency matrix {cm.origin})")
    if m is not None and m.memory_bytes_per_s():
        mem_bw = m.memory_bytes_per_s()
        src["memory_bw"] = f"measured: {mfile}"
    else:
        mem_bw = pick("memory_bw", "memory_bandwidth", DEFAULT_MEMORY_BW) * cm.memory
        src["memory_bw"] = f"{cm.memory:.3g} (efficiency matrix) x " + src["memory_bw"]
    intra = sc.intra_bandwidth.bytes_per_s * cm.intra_link
    nic = sc.nic_bandwidth.bytes_per_s * cm.nic_link
    src["intra_bw"] = f"topology: {sc.intra_bandwidth.source} x {cm.intra_link} (efficiency matrix)"
    src["nic_bw"] = f"topology: {sc.nic_bandwidth.source} x {cm.nic_link} (efficiency matrix)"
    measured_bus = m.busbw("all_reduce", 64 * 2**20) if m is not None else None
    if measured_bus:
        intra = measured_bus
        src["intra_bw"] = f"measured: {mfile} (all_reduce busbw at 64 MiB, {m.ccl})"
    src["host_copy_bw"] = DEFAULT_HOST_COPY_BW[1]
    return ChipFacts(name=name, chip=chip, model=str(model_key), ranks=tuple(sc.ranks),
                     ranks_per_node=len(sc.nodes[0]) if sc.nodes else len(sc.ranks),
                     flops=flops, peak=peak, memory=cm.usable_memory(capacity), memory_bw=mem_bw, intra_bw=intra,
                     nic_bw=nic, host_copy_bw=DEFAULT_HOST_COPY_BW[0], sources=src,
                     link_latency=cm.intra_latency_s, matrix=cm, capacity=capacity)


def spec_memory(topo) -> dict[str, float]:
    """Memory per device the cluster spec states per sub-cluster (`memory = "32 GB"`), by name: read
    from the spec file the topology came from (`Topology.source`); {} without one."""
    src = getattr(topo, "source", None)
    if not src or not Path(str(src)).is_file():
        return {}
    from hal.core.cluster import load_cluster_spec
    return {s.name: s.memory for s in load_cluster_spec(src).sub_clusters if s.memory is not None}


def cluster_facts(topo, matrices: Optional[dict] = None, dtype: Union[str, Callable[[Any], str]] = "bfloat16") \
        -> list[ChipFacts]:
    """Every sub-cluster's figures, with the spec's memory per sub-cluster and the rails priced: the one
    way `hal plan`, plan auto (hal.trainer.autoplan) and the memory check (hal.trainer.memory_fit) read
    a cluster. `dtype`: one dtype for all, or a function of the sub-cluster (a 910A has no bfloat16)."""
    mem = spec_memory(topo)
    return with_rails([chip_facts(sc, matrices, dtype if isinstance(dtype, str) else dtype(sc), memory=mem.get(sc.name))
                       for sc in topo.sub_clusters], topo)


def with_rails(facts: list[ChipFacts], topo) -> list[ChipFacts]:
    """`facts` with `rail_bw` from the topology's one definition of a rail's bandwidth: the leader
    rail's (`Topology.rail_bandwidth(0)`, the slowest NIC among one rank of every chip group; every
    rail of the bridge has one member per chip group, so all rails have this figure) x
    the lowest NIC fraction of the parts' efficiency matrices. A measured rail figure would replace it
    (none is measured yet)."""
    import dataclasses
    if len(topo.sub_clusters) < 2 or not topo.rails:      # one chip group: the bridge has no rails
        return list(facts)
    link = topo.rail_bandwidth(0)
    frac = min(f.matrix.nic_link if f.matrix is not None else 1.0 for f in facts)
    src = (f"topology: Topology.rail_bandwidth(rail 0) = slowest NIC of {list(topo.rails[0])} "
           f"({link.source}) x {frac} (lowest NIC fraction of the efficiency matrices)")
    return [dataclasses.replace(f, rail_bw=link.bytes_per_s * frac,
                                sources={**f.sources, "rail_bw": src}) for f in facts]


def emulated_chip_facts(topo, scale: float, link_bw: float, link_latency: float,
                        dtype: Union[str, Callable[[Any], str]] = "bfloat16",
                        link_source: str = "measured on this host", matrices: Optional[dict] = None) -> list[ChipFacts]:
    """Figures of timed-emulated chips (`HAL_EMULATE_TIMED=1`, hal.emulation.timed): compute and memory speed
    are what the virtual clock charges (`hal.emulation.timed.chip_speeds(chip, dtype, scale)`), not the real
    chip's; every link is the host's CPU fabric (the real one, not emulated), given as `link_bw`
    bytes/s and `link_latency` s per message, measured by the caller (e.g. a send/recv probe:
    benchmarks/planner_prediction.py). The bridge's host staging is a copy on the host: priced on
    the same link figures. Memory capacity is the cluster spec's `memory`, else the catalog's.
    `dtype`: the dtype the clock charges FLOPs at (HAL_EMULATE_TIMED_DTYPE, default bfloat16), or a
    function of the sub-cluster (hal.trainer.autoplan.charged_dtypes: each chip kind its own);
    `matrices` (`load_matrices`): measured efficiency matrices, as HAL_EMULATE_TIMED_MATRIX gives the
    clock, so both sides use the same figures."""
    from hal.emulation import timed
    if scale <= 0:
        raise ValueError(f"emulated_chip_facts: scale = {scale}; must be > 0")
    if link_bw <= 0 or link_latency < 0:
        raise ValueError(f"emulated_chip_facts: link_bw = {link_bw} must be > 0 and link_latency = "
                         f"{link_latency} >= 0")
    out = []
    spec_mem = spec_memory(topo)
    for sc in topo.sub_clusters:
        mx = (matrices or {}).get(str(sc.model)) or (matrices or {}).get(sc.chip) or (None, "")
        d = dtype if isinstance(dtype, str) else dtype(sc)
        flops, bps, why = timed.chip_speeds(sc.chip, d, scale, model=sc.model, matrix=mx[0])
        prof = _catalog_profile(sc.chip, sc.model)
        mem = prof.memory_bytes.value if prof is not None and prof.memory_bytes.value else DEFAULT_MEMORY[0]
        mem = spec_mem.get(sc.name, mem)
        link = f"{link_source}: CPU fabric (timed emulation does not emulate links)"
        src = {"flops": f"timed emulation: {why}", "memory_bw": f"timed emulation: {why}",
               "memory": "cluster spec" if sc.name in spec_mem else f"catalog {prof.model}"
               if prof is not None and prof.memory_bytes.value else DEFAULT_MEMORY[1],
               "intra_bw": link, "nic_bw": link, "host_copy_bw": link,
               "link_latency": f"{link_source}: {link_latency * 1e6:.0f} us per message"}
        sp = timed.chip_speeds(sc.chip, d, scale, model=sc.model, matrix=mx[0])
        out.append(ChipFacts(name=sc.name, chip=sc.chip, model=str(sc.model or (prof.model if prof else sc.chip)),
                             ranks=tuple(sc.ranks), ranks_per_node=len(sc.nodes[0]) if sc.nodes else len(sc.ranks),
                             flops=flops, peak=sp.peak_flops_per_s or flops, memory=mem, memory_bw=bps,
                             intra_bw=link_bw, nic_bw=link_bw, host_copy_bw=float("inf"), sources=src,
                             link_latency=link_latency, matrix=sp.matrix, capacity=mem))
    return out
