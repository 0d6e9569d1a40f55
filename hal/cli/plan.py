"""`hal plan`: find the best layout of a model over a (mixed) cluster, and say how good it is.

    hal plan --cluster examples/clusters/three-vendor-1024.toml --model examples/models/llama-70b.toml \\
             [--batch 1024] [--matrix DIR] [--out plan.toml] [--trace trace.json] [--json plan.json]

Prints the figures it used and where each came from (measured efficiency matrix / catalog /
stated default), the chosen plan as a table (stage -> chip, ranks, layers, TP, DP, rows per
replica by chip, recompute, experts), the predicted step (time, tokens/s, MFU, busy / comm /
bubble / idle shares, peak memory against capacity per sub-cluster), and three efficiency figures
side by side for this plan and the best `Plan.even` layout: (a) against the sum of each sub-cluster
planned alone on the same global batch (what `hal train --measure-parts` measures) and (b) against
the upper bound (every chip at its efficiency matrix's best sustained rate, no communication). All
figures are predictions of the cost model and step simulator (docs/planner.md), not measurements.

Exit codes: 0 a plan was found; 2 bad input or no layout fits (one line naming what and why).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from hal import envs


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", metavar="SPEC.toml",
                   help="cluster spec (default: HAL_CLUSTER, else HAL_EMULATE with one node per chip)")
    p.add_argument("--model", metavar="MODEL.toml", required=True,
                   help="model config (examples/models/: tiny, llama-70b, moe-8x7b, ...)")
    p.add_argument("--batch", type=int, metavar="N",
                   help="global batch in sequences (default: 4M tokens / seq, at least the world size)")
    p.add_argument("--matrix", metavar="DIR",
                   help="directory of efficiency matrices (`hal conformance --level perf --efficiency FILE`) "
                        "to use instead of the catalog's efficiency matrices")
    p.add_argument("--out", metavar="plan.toml", help="write the chosen plan (TOML, or JSON if it ends in .json)")
    p.add_argument("--trace", metavar="trace.json", help="write the simulated step as a Chrome/Perfetto trace")
    p.add_argument("--json", metavar="FILE", dest="json_out",
                   help="write the figures as JSON (step_time_s, tokens_per_s, efficiency, even_efficiency, "
                   "search_s, ...)")
    p.add_argument("--max-pp", type=int, default=32, help="deepest pipeline to consider (default 32)")
    p.add_argument("--schedule", default="1F1B", choices=["1F1B", "GPipe", "Interleaved1F1B", "ZBVZeroBubble"],
                   help="1F1B / GPipe: the schedule of a written 1-stage-per-rank plan (default 1F1B; a "
                        "multi-stage pick keeps its Interleaved1F1B or ZBVZeroBubble); Interleaved1F1B / "
                        "ZBVZeroBubble: only layouts on that schedule compete (mixed stages: torch's "
                        "multi-stage schedules need equal chains)")
    p.add_argument("--only", metavar="NAME[,NAME]",
                   help="plan these sub-clusters of the spec alone (ranks renumbered from 0, as a job launched on "
                        "their nodes numbers them); the others stay idle. Where one part alone is predicted "
                        "faster than the whole cluster's plan, `hal plan` says so and names this flag")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


class CliError(Exception):
    """Bad input: printed as one line, exit 2."""


def _out_path(flag: str, value: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value)
    if not path.parent.exists():
        raise CliError(f"{flag} {value}: directory {path.parent} does not exist")
    if path.is_dir():
        raise CliError(f"{flag} {value}: is a directory")
    return path


def load_inputs(args: argparse.Namespace):
    """(topology, model config, chip facts, node_of) from the flags; CliError on bad input."""
    from hal.core.cluster import load_cluster_spec
    from hal.contract.errors import HalError
    from hal.core.topology import Topology

    from hal.strategies.models import ModelConfig
    from hal.strategies.planner.facts import cluster_facts, load_matrices

    if not Path(args.model).is_file():
        raise CliError(f"--model {args.model}: no such file")
    try:
        cfg = ModelConfig.from_toml(args.model)
    except HalError as exc:
        raise CliError(f"--model {args.model}: {exc}") from None
    try:
        if args.cluster:
            if not Path(args.cluster).is_file():
                raise CliError(f"--cluster {args.cluster}: no such file")
            spec = load_cluster_spec(args.cluster)
            only = [n.strip() for n in args.only.split(",") if n.strip()] if getattr(args, "only", None) is not None \
                else None
            topo = Topology.from_spec(spec.subset(only) if only is not None else spec)
        else:
            if not (envs.HAL_CLUSTER.is_set() or envs.HAL_EMULATE.is_set()):
                raise CliError("no cluster: pass --cluster SPEC.toml (or set HAL_CLUSTER / HAL_EMULATE)")
            if getattr(args, "only", None) is not None:
                raise CliError(f"--only {args.only}: needs --cluster SPEC.toml (the sub-clusters are named there)")
            topo = Topology.from_env()
    except HalError as exc:
        flag = "only" if getattr(args, "only", None) is not None and "sub-cluster(s)" in str(exc) else "cluster"
        raise CliError(f"--{flag}: {exc}") from None
    try:
        matrices = load_matrices(getattr(args, "matrix", None))
        facts = cluster_facts(topo, matrices)
    except (OSError, ValueError) as exc:
        raise CliError(str(exc)) from None
    node_of = {r: topo.node_of(r) for r in range(topo.world_size)}
    return topo, cfg, facts, node_of


def run_reporting(prog: str, body, args: argparse.Namespace) -> int:
    """`body(args)`, with a CliError printed as `prog: error: ...` and exit code 2 (hal plan, simulate)."""
    try:
        return body(args)
    except CliError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    return run_reporting("hal plan", _run, args)


def _run(args: argparse.Namespace) -> int:
    from hal.strategies.planner.convert import to_plan
    from hal.strategies.planner.cost import ModelFacts
    from hal.strategies.planner.report import efficiency_lines, facts_table, plan_table, step_table, summary
    from hal.strategies.planner.plan_search import PlanSearchError, search

    out, trace, json_out = (_out_path("--out", args.out), _out_path("--trace", args.trace),
                            _out_path("--json", args.json_out))
    if args.batch is not None and args.batch < 1:
        raise CliError(f"--batch {args.batch}: must be >= 1")
    if args.max_pp < 1:
        raise CliError(f"--max-pp {args.max_pp}: must be >= 1")
    topo, cfg, facts, node_of = load_inputs(args)
    batch = args.batch or max(topo.world_size, (1 << 22) // cfg.seq)
    model = ModelFacts(cfg)
    t0 = time.perf_counter()

    def progress(msg: str) -> None:
        if not args.quiet:
            print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    print(f"cluster {topo.name or '(from environment)'}: {topo.world_size} ranks, "
          + " + ".join(f"{f.size} x {f.model} ({f.name})" for f in facts))
    print(f"model {cfg.name}: {model.total_params / 1e9:.2f} B parameters, {cfg.layers} layers"
          + (f", {cfg.experts} experts top-{cfg.top_k}" if cfg.experts else "")
          + f"; global batch {batch} x {cfg.seq} = {batch * cfg.seq:,} tokens\n")
    print("figures (per device) and their sources:")
    print(facts_table(facts) + "\n")
    try:
        multi = args.schedule if args.schedule in ("Interleaved1F1B", "ZBVZeroBubble") else None
        result = search(facts, model, batch, node_of=node_of, max_pp=args.max_pp, progress=progress,
                        topology=topo, only_schedule=multi)
    except PlanSearchError as exc:
        raise CliError(str(exc)) from None
    best = result.best
    if best.layout.virtual == 1:     # a multi-stage pick keeps its Interleaved1F1B / ZBVZeroBubble
        best.layout.schedule = args.schedule
    plan = to_plan(best.layout, cfg.name, best.layout.schedule)
    plan.check(topo, cfg)          # never hand out a plan the strategies would reject
    print(f"chosen: {best.describe}")
    print(plan_table(best.layout) + "\n")
    sim = best.sim
    print(f"predicted step: {sim.step_time_s:.3f} s, {sim.tokens_per_s:,.0f} tokens/s, "
          f"bubble {sim.bubble_share:.1%}, communication {sim.comm_share:.1%} of rank-time")
    print(step_table(sim) + "\n")
    print(efficiency_lines(result))
    for note in sim.notes:
        print(f"note: {note}")
    print(f"\nsearch: {result.evaluated} candidates scored, {len(result.finalists)} finalists simulated, "
          f"{result.search_s:.2f} s")
    if out:
        plan.save(out)
        print(f"plan written to {out}")
    if trace:
        from hal.strategies.planner.simulate import simulate
        simulate(best.layout, model, trace=True).write_trace(trace)
        print(f"trace written to {trace} (open in ui.perfetto.dev or chrome://tracing)")
    if json_out:
        json_out.write_text(json.dumps(summary(result, cfg.name, batch, cfg.seq), indent=2) + "\n")
        print(f"figures written to {json_out}")
    return 0
