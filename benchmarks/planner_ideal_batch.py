"""How much the planner's ideal (each sub-cluster planned alone) depends on the batch it is given.

The ideal of `hal plan` / benchmarks/planner_scale.py is the sum of each part's best tokens/s on its
share of the global batch (plan_search.batch_shares, rounded to 8, 64 or 512). When memory forces
every part alone into a pipeline (a MoE whose experts are whole on every rank), a part's throughput
grows with its batch (more micro-batches, a smaller bubble), so the share convention can put the
ideal below a whole-cluster plan that pushes the whole batch through every stage. This prints, per
cluster size, each part's predicted tokens/s alone on: its share rounded to 8, to 512, and the
whole global batch, the sums, and the whole-cluster plan's efficiency against each sum.

    python benchmarks/planner_ideal_batch.py [--model moe-8x7b] [--sizes 1024,4096]

Same clusters and batch as planner_scale.py (half H100, a quarter 910B2, a quarter P800; 4M tokens).
All figures are cost-model predictions (nothing runs).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from planner_scale import cluster  # noqa: E402
from hal.strategies.models import ModelConfig  # noqa: E402
from hal.strategies.planner import ModelFacts, chip_facts, search  # noqa: E402
from hal.strategies.planner.facts import with_rails  # noqa: E402
from hal.strategies.planner.plan_search import finalize, batch_shares, mixed_candidates  # noqa: E402


def alone(f, model: ModelFacts, batch: int, node_of) -> float:
    """Best simulated tokens/s of sub-cluster `f` alone on `batch` samples (0: nothing fits)."""
    got = [c for c in finalize(mixed_candidates([f], model, batch), model, 6, node_of) if c.sim.fits]
    return got[0].sim.tokens_per_s if got else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="moe-8x7b")
    ap.add_argument("--sizes", default="1024,4096")
    ap.add_argument("--tokens", type=int, default=1 << 22)
    args = ap.parse_args()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfg = ModelConfig.from_toml(os.path.join(here, "examples", "models", f"{args.model}.toml"))
    model = ModelFacts(cfg)
    for n in [int(x) for x in args.sizes.split(",")]:
        topo = cluster(n)
        facts = with_rails([chip_facts(sc) for sc in topo.sub_clusters], topo)
        node_of = {r: topo.node_of(r) for r in range(topo.world_size)}
        batch = max(n, args.tokens // cfg.seq)
        res = search(facts, model, batch, node_of=node_of, topology=topo)
        plan = res.best.sim.tokens_per_s
        print(f"{args.model} {n} chips, global batch {batch}: whole-cluster plan {plan:,.0f} tokens/s "
              f"({res.best.describe}); search's ideal {res.ideal_tokens_per_s:,.0f} -> {res.efficiency:.1%}")
        for label, shares in (("share, multiple of 8", batch_shares(facts, batch, 8)),
                              ("share, multiple of 512", batch_shares(facts, batch, 512)),
                              ("whole global batch", [batch] * len(facts))):
            parts = [(f.name, b, alone(f, model, b, node_of)) for f, b in zip(facts, shares)]
            tot = sum(t for _, _, t in parts)
            each = ", ".join(f"{name} {t:,.0f} on {b}" for name, b, t in parts)
            eff = f"{plan / tot:.1%}" if tot else "-"
            print(f"  parts alone on {label:24}: {tot:12,.0f} tokens/s  plan / this = {eff:>6}  ({each})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
