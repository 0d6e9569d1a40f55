"""How the plan search scales: search time (wall and CPU) and plan quality for mixed clusters of
64 to 8192 chips of three kinds (half H100, a quarter Ascend 910B2, a quarter Kunlun P800, 8 per
node: the proportions of examples/clusters/three-vendor-1024.toml), for a 70B-class dense model
and a MoE model. Prints a table; efficiency is the chosen plan's (a), predicted tokens/s over the sum
of each sub-cluster planned alone on the same global batch ("-" where a part cannot hold the model
alone), and (b) over the upper bound, next to the best Plan.even layout's (a). All figures are the
cost model's predictions, not measured training.

    python benchmarks/planner_scale.py [--sizes 64,256,1024,4096,8192] [--models llama-70b,moe-8x7b]
                                       [--repeats 3]

Wall and CPU seconds are the median of --repeats searches (the machine is shared: wall time grows
with load, CPU seconds much less); the plan and its figures are the same every repeat (the search is
deterministic). "even" is the best Plan.even layout's tokens/s over the same parts' sum.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hal.core.cluster import parse_cluster_spec  # noqa: E402
from hal.core.topology import Topology  # noqa: E402
from hal.strategies.models import ModelConfig  # noqa: E402
from hal.strategies.planner import ModelFacts, chip_facts, search  # noqa: E402


def cluster(n: int) -> Topology:
    h, a = n // 2, n // 4
    k = n - h - a
    text = ""
    for name, chip, model, ranks in (("h100", "cuda", "H100", h), ("ascend", "ascend", "910B2", a),
                                     ("kunlun", "kunlun", "P800", k)):
        text += (f'[[sub_clusters]]\nname = "{name}"\nchip = "{chip}"\nmodel = "{model}"\n'
                 f"nodes = {ranks // 8}\nranks_per_node = 8\n")
    return Topology.from_spec(parse_cluster_spec(text, f"<{n} chips>"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="64,256,1024,4096,8192")
    ap.add_argument("--models", default="llama-70b,moe-8x7b")
    ap.add_argument("--tokens", type=int, default=1 << 22, help="global batch in tokens (default 4M)")
    ap.add_argument("--repeats", type=int, default=3, help="searches per size; wall and CPU s are their median")
    args = ap.parse_args()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    print(f"load average at start: {os.getloadavg()[0]:.1f} (wall times grow with load; CPU s do not)")
    print(f"{'model':10} {'chips':>6} {'batch':>6} {'wall s':>7} {'CPU s':>6} {'cands':>6} {'efficiency':>10} "
          f"{'even':>6}  chosen layout")
    for name in args.models.split(","):
        cfg = ModelConfig.from_toml(os.path.join(here, "examples", "models", f"{name}.toml"))
        model = ModelFacts(cfg)
        for n in [int(x) for x in args.sizes.split(",")]:
            topo = cluster(n)
            facts = [chip_facts(sc) for sc in topo.sub_clusters]
            node_of = {r: topo.node_of(r) for r in range(topo.world_size)}
            batch = max(n, args.tokens // cfg.seq)
            walls, cpus = [], []
            try:
                for _ in range(max(1, args.repeats)):
                    w0, c0 = time.perf_counter(), time.process_time()
                    res = search(facts, model, batch, node_of=node_of, topology=topo)
                    walls.append(time.perf_counter() - w0)
                    cpus.append(time.process_time() - c0)
            except Exception as exc:  # report and go on: one size that fits nothing is a figure too
                print(f"{name:10} {n:6} {batch:6} {'-':>7} {'-':>6} {'-':>6} {'-':>10} {'-':>6}  {type(exc).__name__}: {exc}")
                continue
            wall, cpu = statistics.median(walls), statistics.median(cpus)
            ev = f"{res.even_efficiency:.1%}" if res.even_efficiency is not None else "none"
            eff = f"{res.efficiency:.1%}" if res.efficiency is not None else "-"
            print(f"{name:10} {n:6} {batch:6} {wall:7.1f} {cpu:6.1f} {res.evaluated:6} {eff:>10} "
                  f"{ev:>6}  (b) {res.bound_efficiency:.1%}  {res.best.describe}", flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
