"""`hal simulate`: predict one training step of a given plan on a cluster (cost model + step
simulator, docs/planner.md): step time, tokens/s, MFU, busy / comm / bubble / idle shares and peak
memory per sub-cluster, optionally a Chrome/Perfetto trace.

    hal simulate --plan plan.toml --cluster SPEC.toml --model MODEL.toml [--trace t.json] [--json f.json]

The plan is checked against the cluster and model first (`Plan.check`). Exit codes: 0 simulated;
2 bad input (one line naming what and why).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from hal.cli.plan import CliError, _out_path, load_inputs, run_reporting


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plan", metavar="plan.toml", required=True,
                   help="a plan (TOML or JSON), e.g. from `hal plan --out`")
    p.add_argument("--cluster", metavar="SPEC.toml", help="cluster spec (default: HAL_CLUSTER, else HAL_EMULATE)")
    p.add_argument("--model", metavar="MODEL.toml", required=True, help="model config the plan is for")
    p.add_argument("--matrix", metavar="DIR", help="directory of measured efficiency matrices")
    p.add_argument("--trace", metavar="trace.json", help="write the simulated step as a Chrome/Perfetto trace")
    p.add_argument("--json", metavar="FILE", dest="json_out", help="write step_time_s, tokens_per_s, ... as JSON")


def run(args: argparse.Namespace) -> int:
    return run_reporting("hal simulate", _run, args)


def _run(args: argparse.Namespace) -> int:
    from hal.contract.errors import HalError

    from hal.strategies.plan import Plan
    from hal.strategies.planner.convert import from_plan
    from hal.strategies.planner.cost import ModelFacts
    from hal.strategies.planner.report import plan_table, step_table
    from hal.strategies.planner.simulate import simulate

    trace, json_out = _out_path("--trace", args.trace), _out_path("--json", args.json_out)
    if not Path(args.plan).is_file():
        raise CliError(f"--plan {args.plan}: no such file")
    topo, cfg, facts, node_of = load_inputs(args)
    try:
        plan = Plan.load(args.plan)
        plan.check(topo, cfg)
    except HalError as exc:
        raise CliError(f"--plan {args.plan}: {exc}") from None
    layout = from_plan(plan, facts, node_of)
    model = ModelFacts(cfg)
    sim = simulate(layout, model, trace=bool(trace))
    print(plan_table(layout) + "\n")
    print(f"predicted step: {sim.step_time_s:.3f} s, {sim.tokens_per_s:,.0f} tokens/s, "
          f"bubble {sim.bubble_share:.1%}, communication {sim.comm_share:.1%} of rank-time"
          + ("" if sim.fits else "  -- DOES NOT FIT MEMORY on some rank"))
    print(step_table(sim))
    for note in sim.notes:
        print(f"note: {note}")
    if trace:
        sim.write_trace(trace)
        print(f"trace written to {trace}")
    if json_out:
        json_out.write_text(json.dumps({"step_time_s": sim.step_time_s, "tokens_per_s": sim.tokens_per_s,
                                        "mfu": sim.mfu, "bubble_share": sim.bubble_share,
                                        "comm_share": sim.comm_share, "fits": sim.fits}, indent=2) + "\n")
        print(f"figures written to {json_out}")
    return 0 if sim.fits else 1
