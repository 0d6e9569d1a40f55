"""`hal train --measure-parts`: the reference a mixed-cluster run is measured against.

Before the main run, on the same machine, it runs (each a short `hal train` of `efficiency.steps` steps,
no checkpoints, into `<run dir>/parts/<name>/`):
  - every sub-cluster ALONE (`cuda:2`, then `ascend:2`, ...), laid out by the planner for that
    sub-cluster (`plan.source = auto`) and, with `efficiency.part_even` (default on, sub-clusters of 2+
    ranks), also with Plan.even (DP over its ranks): the planner's pick is not always the fastest
    measured, and the reference is each sub-cluster's BEST measured layout; with the run's global
    batch, model, data and timed emulation;
  - the whole cluster with `Plan.even` (the config's even settings; when the main plan is itself
    `even`, the main run is that measurement and this one is skipped).
Then the main run. At its end rank 0 computes (hal.trainer.loop -> `efficiency`):

    efficiency      = tokens/s of this run / sum over sub-clusters of tokens/s measured alone
    even_efficiency = tokens/s of Plan.even / the same sum

with tokens/s the median over the measured steps after the first `efficiency.skip`. The parts' figures
are only comparable with timed emulation (HAL_EMULATE_TIMED / cluster.timed): without it every
emulated chip runs at the host CPU's speed, and a part alone has the CPU cores to itself - the run says
so next to the figures. Sub-clusters come from the cluster the main run trains on, in the order
hal/cli/train.py picks it: `cluster.emulate` (an emulate map: one part per chip kind, `cuda:2`), else
`cluster.spec` (a cluster spec TOML, hal.core.cluster: one part per `[[sub_clusters]]` entry, each written
as its own one-sub-cluster spec `<run dir>/parts/<name>/cluster.toml`, its model, bandwidths and
emulate flag kept, `colocate` dropped: it is alone on its node), else HAL_EMULATE, else HAL_CLUSTER.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Optional

from hal import envs
from hal.contract.errors import HalError


class PartsError(HalError, ValueError):
    """--measure-parts cannot run for this config; names the field and value."""


# ---- TOML out (the stdlib reads TOML but does not write it) --------------------------------------
def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string of printable text is a TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_value(x)}" for k, x in v.items() if x is not None) + " }"
    raise TypeError(f"cannot write {type(v).__name__} {v!r} as TOML")


def to_toml(data: dict) -> str:
    """A TrainConfig dump as TOML: top-level scalars, then one [section] per dict (inline tables below)."""
    top = [f"{k} = {_value(v)}" for k, v in data.items() if not isinstance(v, dict) and v is not None]
    sections = []
    for k, v in data.items():
        if isinstance(v, dict):
            sections.append(f"\n[{k}]")
            sections += [f"{kk} = {_value(vv)}" for kk, vv in v.items() if vv is not None]
    return "\n".join(top + sections) + "\n"


# ---- the parts -----------------------------------------------------------------------------------
def emulate_map(cfg) -> str:
    text = cfg.cluster.emulate or ("" if cfg.cluster.spec else envs.HAL_EMULATE.text())
    if not text.strip():
        raise PartsError(f"cluster.emulate = {cfg.cluster.emulate!r}, cluster.spec = {cfg.cluster.spec!r} and "
                         f"HAL_EMULATE / HAL_CLUSTER are unset: --measure-parts splits the cluster (an emulate map "
                         f"such as 'cuda:2,ascend:2', or a cluster spec file) into its sub-clusters")
    return text


def cluster_spec_path(cfg) -> Optional[Path]:
    """The cluster spec file the run trains on, when its cluster is a spec (cluster.spec, or HAL_CLUSTER
    with no emulate map anywhere), else None."""
    if cfg.cluster.emulate:
        return None
    if cfg.cluster.spec:
        return cfg.resolve(cfg.cluster.spec)
    if not envs.HAL_EMULATE.is_set() and envs.HAL_CLUSTER.is_set():
        return Path(envs.HAL_CLUSTER.text()).resolve()
    return None


def spec_toml(spec, subs: list) -> str:
    """A cluster spec TOML (hal.core.cluster's format) of `subs` (SubCluster) under `spec`'s name."""
    what = "--measure-parts: " + ", ".join(x.name for x in subs) + " of " + (spec.source or spec.name)
    lines = [f"name = {_value(spec.name)}", f"description = {_value(what)}"]
    for i, sub in enumerate(subs):
        lines.append("\n[[sub_clusters]]")
        for k, v in sub.model_dump().items():
            if k == "colocate" and i == 0:
                v = False  # alone: the first sub-cluster has no node before it to share
            if v is not None:
                lines.append(f"{k} = {_value(v)}")
    return "\n".join(lines) + "\n"


def spec_parts(cfg) -> list[tuple[str, str, int]]:
    """(part name, one-sub-cluster spec TOML, ranks) of every sub-cluster of the run's cluster spec; []
    when the cluster is an emulate map."""
    path = cluster_spec_path(cfg)
    if path is None:
        return []
    from hal.core.cluster import load_cluster_spec
    spec = load_cluster_spec(path)  # ClusterSpecError names the file, line and field
    return [(f"{sub.name}-{sub.world_size}", spec_toml(spec, [sub]), sub.world_size) for sub in spec.sub_clusters]


def part_configs(cfg) -> list[tuple[str, dict]]:
    """(name, config dict) of every measurement --measure-parts makes before the main run. A part of a
    cluster spec names its own spec file (`cluster.spec`), which `measure` writes from `spec_parts`."""
    from hal.emulation.emulate import parse_emulate_map
    specs = spec_parts(cfg)
    if specs:
        whole = str(cluster_spec_path(cfg))
        items = [(name, n, "") for name, _, n in specs]
    else:
        whole = None
        text = emulate_map(cfg)
        items = [(f"{chip}-{n}", n, f"{chip}:{n}") for chip, n in parse_emulate_map(text)]
        if any(n is None for _, n, _ in items):
            raise PartsError(f"HAL_EMULATE / cluster.emulate = {text!r}: --measure-parts needs counts "
                             f"(e.g. 'cuda:2,ascend:2')")
    base = cfg.model_dump()
    root = cfg.run_dir / "parts"
    stop = min(cfg.efficiency.steps, cfg.steps)
    out = []

    def derived(name: str, cluster: str, plan: dict) -> dict:
        d = json.loads(json.dumps(base))
        d["stop_after"] = stop
        if whole is None:  # an emulate map
            d["cluster"] = {**d["cluster"], "emulate": cluster, "spec": None}
        else:  # a spec file: the whole one, or the part's own (written by measure)
            d["cluster"] = {**d["cluster"], "emulate": None,
                            "spec": cluster if cluster == whole else str(root / name / "cluster.toml")}
        d["plan"] = plan
        d["checkpoint"] = {**d["checkpoint"], "enabled": False}
        d["log"] = {**d["log"], "dir": str(root / name), "val_interval": 0, "val_batches": 1,
                    "print_interval": max(1, stop)}
        d["slow_node"] = {**d["slow_node"], "replan": False}
        d["efficiency"] = {**d["efficiency"], "part": True}
        d.pop("debug", None)  # a part measures the cluster as it is: no test-only faults
        return d

    p = cfg.plan
    moe = cfg.load_model_config().is_moe
    for name, n, here in items:  # here: the part's emulate map ('cuda:2'), or "" (its own spec file)
        out.append((name, derived(name, here, {"source": "auto", "max_pp": p.max_pp})))
        if cfg.efficiency.part_even and n > 1:  # the planner's pick is not always the fastest: measure DP too
            out.append((f"{name}-even", derived(f"{name}-even", here, {"source": "even", "ep": moe})))
    if p.source != "even":
        even = {"source": "even", "pp": p.pp, "tp": p.tp, "zero": p.zero, "num_microbatches": p.num_microbatches,
                "ep": p.ep or cfg.load_model_config().is_moe}
        out.append(("even", derived("even", whole if whole is not None else text, even)))
    return out


def measure(args: argparse.Namespace, cfg, run) -> int:
    """Run every part (`run`: hal.cli.train.run for one config); 0 when all finished."""
    specs = {n: text for name, text, _ in spec_parts(cfg) for n in (name, f"{name}-even")}
    for name, data in part_configs(cfg):
        d = cfg.run_dir / "parts" / name
        d.mkdir(parents=True, exist_ok=True)
        if name in specs:  # a sub-cluster of a cluster spec: its own one-sub-cluster spec
            (d / "cluster.toml").write_text(specs[name])
        for old in ("metrics.jsonl", "summary.json"):  # a fresh measurement, not appended to an old one
            (d / old).unlink(missing_ok=True)
        path = d / "train.toml"
        path.write_text(f"# --measure-parts: {name} (written by hal/trainer/parts.py)\n" + to_toml(data))
        print(f"hal train --measure-parts: {name}: {data['cluster']['emulate'] or data['cluster']['spec']} with plan "
              f"{data['plan']['source']}, {data['stop_after']} steps", flush=True)
        ns = argparse.Namespace(config=str(path), steps=None, stop_after=None, run_dir=None, plan=None, seed=None,
                                max_restarts=0, measure_parts=False)
        code = run(ns)
        if code != 0:
            print(f"hal train --measure-parts: {name} FAILED (exit code {code}); see {d}", flush=True)
            return code
    return 0


def _median_tps(run_dir: Path) -> Optional[float]:
    s = run_dir / "summary.json"
    if not s.is_file():
        return None
    return json.loads(s.read_text()).get("tokens_per_s_median")


def efficiency(cfg, measured: Optional[float]) -> dict:
    """summary.json's efficiency figures from this run's median tokens/s and the parts' summaries
    (None where a part was not measured: run with --measure-parts)."""
    root = cfg.run_dir / "parts"
    try:
        names = [n for n, _ in part_configs(cfg) if n != "even"]
    except HalError as exc:
        return {"efficiency": None, "even_efficiency": None, "parts": {}, "efficiency_note": str(exc)}
    measured_parts = {n: _median_tps(root / n) for n in names}
    parts: dict[str, Optional[float]] = {}  # per sub-cluster: the best of its measured layouts
    best_of: dict[str, str] = {}
    for n, v in measured_parts.items():
        key = n[:-len("-even")] if n.endswith("-even") else n
        if key not in parts or (v is not None and (parts[key] is None or v > parts[key])):
            parts[key], best_of[key] = v, ("Plan.even" if n.endswith("-even") else "plan auto")
    even = measured if cfg.plan.source == "even" else _median_tps(root / "even")
    ideal = sum(parts.values()) if parts and all(v for v in parts.values()) else None
    out = {"parts": parts, "parts_layout": best_of, "parts_measured": measured_parts,
           "parts_sum_tokens_per_s": ideal, "tokens_per_s": measured,
           "even_tokens_per_s": even,
           "efficiency": measured / ideal if ideal and measured else None,
           "even_efficiency": even / ideal if ideal and even else None}
    if ideal is None:
        out["efficiency_note"] = "sub-clusters not measured alone: run `hal train --measure-parts`"
    return out


def report(eff: dict, timed: bool, plan_source: str) -> list[str]:
    """The lines the run ends with."""
    def r(x):
        return "n/a" if x is None else f"{x:,.0f}"
    how = "timed emulation" if timed else "NO timed emulation: chips run at host CPU speed, figures not meaningful"
    lines = [f"MIXED-CLUSTER EFFICIENCY ({how}; every chip EMULATED on this host's CPU)"]
    if eff.get("parts_sum_tokens_per_s") is None:
        lines.append(f"  {eff.get('efficiency_note', 'parts not measured')}; this run: "
                     f"{r(eff.get('tokens_per_s'))} tok/s")
        return lines
    layouts = eff.get("parts_layout", {})
    parts = " + ".join(f"{n} {r(v)} ({layouts.get(n, 'plan auto')})" for n, v in eff["parts"].items())
    lines.append(f"  sub-clusters alone, each with its best measured layout: {parts} = "
                 f"{r(eff['parts_sum_tokens_per_s'])} tok/s")
    lines.append(f"  this run (plan {plan_source}): {r(eff['tokens_per_s'])} tok/s -> efficiency "
                 f"{eff['efficiency'] * 100:.1f}%" if eff.get("efficiency") else "  this run: n/a")
    lines.append(f"  Plan.even: {r(eff['even_tokens_per_s'])} tok/s -> even_efficiency "
                 f"{eff['even_efficiency'] * 100:.1f}%" if eff.get("even_efficiency") else "  Plan.even: not measured")
    return lines
