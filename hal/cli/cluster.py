"""Show a cluster spec: world size, each sub-cluster's chip, ranks and nodes, its link figures, and
the bridge's rails, all from `hal.core.topology.Topology` (the one topology the bridge also runs).

    hal cluster show examples/clusters/h800-910b-32.toml [--json]

Link figures are the spec's overrides (`spec`), else the catalog profile's (`catalog`), else a stated
default (`default`; see hal.core.topology). Chip names are checked against the chips the discovered
plugins provide.
"""
from __future__ import annotations

import argparse

from hal.core.topology import Link, Topology


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="validate a cluster spec and print its rank layout")
    show.add_argument("file", help="cluster spec TOML file")
    show.add_argument("--json", action="store_true", help="print JSON instead of text")


def _rate(link: Link) -> str:
    return f"{link.bytes_per_s / 1e9:g} GB/s ({link.source.split(':')[0]})"


def _rails_line(topo) -> str:
    lay = topo.layout
    n = len(lay.rails)
    if lay.k == 1:
        return "0 rails (one chip kind: no bridge)"
    if not lay.rail_mode:
        return f"1 rail (leader-only: {lay.parts} parts > max_parts; large collectives take leader paths)"
    return f"{n} rail(s)"


def run(args: argparse.Namespace) -> int:
    from hal.core.cluster import load_cluster_spec
    from hal.core.plugin_manager import get_plugin_manager
    spec = load_cluster_spec(args.file, pm=get_plugin_manager())
    topo = Topology.from_spec(spec)
    by_name = {s.name: s for s in spec.sub_clusters}
    if args.json:
        from hal.cli import print_json
        rows = []
        for s in topo.sub_clusters:
            d = s.describe()
            d.update(ranks_per_node=by_name[s.name].ranks_per_node, colocate=by_name[s.name].colocate,
                     node_range=[s.node_ids[0], s.node_ids[-1]])
            rows.append(d)
        print_json({"name": spec.name, "file": spec.source, "world_size": topo.world_size,
                    "nodes": topo.num_nodes, "sub_clusters": rows, "parts": topo.layout.parts,
                    "rail_mode": topo.layout.rail_mode, "rails": topo.rails})
        return 0
    print(f"cluster {spec.name or '(unnamed)'} from {spec.source}: world size {topo.world_size}, "
          f"{topo.num_nodes} node(s), {_rails_line(topo)}")
    print(f"  {'sub-cluster':<14} {'chip':<8} {'model':<8} {'ranks':<11} {'nodes':<9} {'x ranks':<8} "
          f"{'mode':<9} {'intra':<22} nic")
    for s in topo.sub_clusters:
        ranks = f"{s.ranks[0]}-{s.ranks[-1]}"
        nodes = f"{s.node_ids[0]}-{s.node_ids[-1]}"
        print(f"  {s.name:<14} {s.chip:<8} {s.model or '-':<8} {ranks:<11} {nodes:<9} "
              f"{by_name[s.name].ranks_per_node:<8} {'EMULATED' if s.emulated else 'native':<9} "
              f"{_rate(s.intra_bandwidth):<22} {_rate(s.nic_bandwidth)}")
    if topo.layout.k > 1:
        shown = topo.rails[:4]
        more = f" ... ({len(topo.rails) - 4} more)" if len(topo.rails) > 4 else ""
        print(f"  rails: {'; '.join(str(r) for r in shown)}{more}; rail 0 {_rate(topo.rail_bandwidth(0))}")
    for s in topo.sub_clusters:
        for link, what in ((s.intra_bandwidth, "intra"), (s.nic_bandwidth, "nic")):
            if link.source.startswith("default"):
                print(f"  note: {s.name} {what} bandwidth is a {link.source}; set it in the spec")
    return 0
