"""Show a cluster spec: world size, each sub-cluster's chip, ranks and nodes, and its link figures.

    hal cluster show examples/clusters/h800-910b-32.toml [--json]

Link figures are the spec's overrides, else the catalog profile's (marked `catalog`), else unknown.
Chip names are checked against the chips the discovered plugins provide.
"""
from __future__ import annotations

import argparse
from typing import Optional


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="validate a cluster spec and print its rank layout")
    show.add_argument("file", help="cluster spec TOML file")
    show.add_argument("--json", action="store_true", help="print JSON instead of text")


def _links(chip: str, model: Optional[str], intra: Optional[float], nic: Optional[float]) -> dict:
    from . import catalog
    prof = None
    if chip in catalog.chips():
        prof = catalog.get(chip, model) if model else catalog.default(chip)
    out = {}
    for name, override, fig in (("intra_bandwidth", intra, prof.intra_node_bandwidth if prof else None),
                                ("nic_bandwidth", nic, prof.nic_bandwidth if prof else None)):
        if override is not None:
            out[name] = {"value": override, "from": "spec"}
        elif fig is not None and fig.known:
            out[name] = {"value": fig.value, "from": f"catalog {prof.model}"}
        else:
            out[name] = {"value": None, "from": "unknown"}
    return out


def _rate(v: Optional[float]) -> str:
    return "unknown" if v is None else f"{v / 1e9:g} GB/s"


def run(args: argparse.Namespace) -> int:
    from .cluster import load_cluster_spec
    from .plugin_manager import get_plugin_manager
    spec = load_cluster_spec(args.file, pm=get_plugin_manager())
    rows = []
    for s in spec.sub_clusters:
        ranks = spec.ranks_of(s.name)
        first, last = ranks[0], ranks[-1]
        a, b = spec.assignment(first), spec.assignment(last)
        rows.append(dict(s.model_dump(), ranks=[first, last], node_range=[a.node, b.node],
                         links=_links(s.chip, s.model, s.intra_bandwidth, s.nic_bandwidth)))
    if args.json:
        from .cli import print_json
        print_json({"name": spec.name, "file": spec.source, "world_size": spec.world_size,
                    "nodes": spec.num_nodes, "sub_clusters": rows, "rails": len(spec.rails())})
        return 0
    print(f"cluster {spec.name or '(unnamed)'} from {spec.source}: world size {spec.world_size}, "
          f"{spec.num_nodes} node(s), {len(spec.rails())} rail(s)")
    print(f"  {'sub-cluster':<14} {'chip':<8} {'model':<8} {'ranks':<11} {'nodes':<9} {'x ranks':<8} "
          f"{'mode':<9} {'intra':<22} nic")
    for r in rows:
        links = r["links"]
        intra = f"{_rate(links['intra_bandwidth']['value'])} ({links['intra_bandwidth']['from'].split()[0]})"
        nic = f"{_rate(links['nic_bandwidth']['value'])} ({links['nic_bandwidth']['from'].split()[0]})"
        ranks = f"{r['ranks'][0]}-{r['ranks'][1]}"
        nodes = f"{r['node_range'][0]}-{r['node_range'][1]}"
        print(f"  {r['name']:<14} {r['chip']:<8} {r['model'] or '-':<8} {ranks:<11} {nodes:<9} {r['ranks_per_node']:<8} "
              f"{'EMULATED' if r['emulate'] else 'native':<9} {intra:<22} {nic}")
    return 0
