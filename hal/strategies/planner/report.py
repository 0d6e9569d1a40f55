"""What `hal plan` and `hal simulate` print: the figures and their sources, the plan as a table,
the predicted step, and its efficiency against (a) the parts alone and (b) the upper bound, beside
Plan.even; and the JSON form."""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from .cost import recompute_kind
from .facts import ChipFacts
from .simulate import Layout, SimResult


def ranges(ranks: Sequence[int]) -> str:
    """[0, 1, 2, 5, 6] -> '0-2,5-6'."""
    out, start, prev = [], None, None
    for r in sorted(ranks):
        if start is None:
            start = prev = r
        elif r == prev + 1:
            prev = r
        else:
            out.append(f"{start}-{prev}" if prev > start else f"{start}")
            start = prev = r
    if start is not None:
        out.append(f"{start}-{prev}" if prev > start else f"{start}")
    return ",".join(out)


def _table(rows: list[list[str]]) -> str:
    """Left-aligned columns, a rule under the header row."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def facts_table(facts: Sequence[ChipFacts]) -> str:
    """Every figure of every sub-cluster with its source (the first table of `hal plan`)."""
    rows = [["sub-cluster", "figure", "value", "source"]]
    for f in facts:
        for i, (name, value, src) in enumerate(f.describe()):
            rows.append([f"{f.name} ({f.size} x {f.model})" if i == 0 else "", name, value, src])
    return _table(rows)


def plan_table(layout: Layout) -> str:
    """One row per stage: layers, chips, ranks, TP, DP, rows and experts per replica by chip, recompute."""
    rows = [["stage", "layers", "chip(s)", "ranks", "tp", "dp", "rows per replica (by chip)", "recompute", "experts"]]
    placed: dict[int, list] = defaultdict(list)
    if layout.virtual > 1:      # Interleaved1F1B / ZBVZeroBubble: each row is a rank group and its plan stages
        from .convert import stage_placement
        rows[0][0:2] = ["group", f"layers of its {layout.virtual} stages ({layout.schedule})"]
        for s, rng in stage_placement(layout):
            placed[s].append(f"[{rng[0]}, {rng[1]})")
    for s, st in enumerate(layout.stages):
        chips = list(dict.fromkeys(r.facts.name for r in st.reps))
        per_chip = defaultdict(list)
        exp = defaultdict(list)
        for r in st.reps:
            per_chip[r.facts.name].append(r.mb)
            if r.experts is not None:
                exp[r.facts.name].append(r.experts)

        def span(v: list[int]) -> str:
            return str(v[0]) if min(v) == max(v) else f"{min(v)}-{max(v)}"
        rows.append([str(s), " + ".join(placed[s]) or f"[{st.layers[0]}, {st.layers[1]})", "+".join(chips),
                     ranges([x for r in st.reps for x in r.ranks]), str(len(st.reps[0].ranks)), str(len(st.reps)),
                     ", ".join(f"{c}: {span(v)}" for c, v in per_chip.items()),
                     recompute_kind(st.recompute),
                     ", ".join(f"{c}: {span(v)}" for c, v in exp.items()) or "-"])
    return _table(rows)


def step_table(sim: SimResult) -> str:
    """Per sub-cluster: MFU, busy / comm / bubble / idle shares of the step, peak memory against capacity."""
    by = defaultdict(list)
    for r in sim.ranks:
        by[r.sub_cluster].append(r)
    rows = [["sub-cluster", "ranks", "MFU", "busy", "comm", "bubble", "idle", "peak memory / usable"]]
    for name, rs in by.items():
        n = len(rs)
        t = sim.step_time_s
        mem = max(r.memory_bytes for r in rs)
        cap = rs[0].capacity_bytes
        rows.append([name, str(n), f"{sim.mfu.get(name, 0):.1%}", f"{sum(r.busy_s for r in rs) / n / t:.1%}",
                     f"{sum(r.comm_s for r in rs) / n / t:.1%}", f"{sum(r.bubble_s for r in rs) / n / t:.1%}",
                     f"{sum(r.idle_s for r in rs) / n / t:.1%}",
                     f"{mem / 1e9:.1f} / {cap / 1e9:.0f} GB ({mem / cap:.0%})"])
    return _table(rows)


def _peak_memory(sim: SimResult) -> dict[str, float]:
    """The largest rank's memory per sub-cluster."""
    out: dict[str, float] = {}
    for r in sim.ranks:
        out[r.sub_cluster] = max(out.get(r.sub_cluster, 0.0), r.memory_bytes)
    return out


def summary(result, model_name: str, batch: int, seq: int) -> dict:
    """The JSON of `hal plan --json` (a `search.SearchResult`)."""
    best, even = result.best, result.even
    return {
        "model": model_name, "global_batch": batch, "tokens_per_step": batch * seq,
        "step_time_s": best.sim.step_time_s, "tokens_per_s": best.sim.tokens_per_s,
        "efficiency": result.efficiency, "even_efficiency": result.even_efficiency,
        "parts_tokens_per_s": result.parts_tokens_per_s,
        "bound_efficiency": result.bound_efficiency, "even_bound_efficiency": result.even_bound_efficiency,
        "bound_tokens_per_s": result.bound_tokens_per_s,
        "even_tokens_per_s": even.sim.tokens_per_s if even else None,
        "even_step_time_s": even.sim.step_time_s if even else None,
        "even_layout": even.describe if even else None,
        "parts": {k: ({"tokens_per_s": c.sim.tokens_per_s, "layout": c.describe} if c is not None else None)
                  for k, c in result.parts.items()},
        "layout": best.describe, "family": best.family,
        "mfu": best.sim.mfu, "bubble_share": best.sim.bubble_share, "comm_share": best.sim.comm_share,
        "peak_memory_bytes": _peak_memory(best.sim),
        "search_s": result.search_s, "candidates": result.evaluated,
        "notes": best.sim.notes,
    }


def _pct(x) -> str:
    return f"{x:9.1%}" if x is not None else f"{'-':>9}"


def efficiency_lines(result) -> str:
    """This plan and the best even layout against (a) the parts alone on the same global batch and
    (b) the upper bound (every chip at its matrix's best sustained rate, no communication)."""
    parts = result.parts_tokens_per_s
    lines = [f"{'':12} {'tokens/s':>12} {'step (s)':>9} {'(a) parts':>9} {'(b) bound':>9}",
             f"{'this plan':12} {result.best.sim.tokens_per_s:12.0f} {result.best.sim.step_time_s:9.3f} "
             f"{_pct(result.efficiency)} {_pct(result.bound_efficiency)}"]
    if result.even is not None:
        lines.append(f"{'Plan.even':12} {result.even.sim.tokens_per_s:12.0f} {result.even.sim.step_time_s:9.3f} "
                     f"{_pct(result.even_efficiency)} {_pct(result.even_bound_efficiency)}   ({result.even.describe})")
    else:
        lines.append(f"{'Plan.even':12} {'-':>12} {'-':>9} {'-':>9} {'-':>9}   (no even layout fits memory)")
    lines.append(f"{'(a) parts':12} {parts:12.0f}" if parts else f"{'(a) parts':12} {'-':>12}")
    lines[-1] += "   (each sub-cluster alone on the same global batch, its best predicted layout:)"
    for k, c in result.parts.items():
        lines.append(f"{'':14}{k}: " + (f"{c.sim.tokens_per_s:.0f} tokens/s with {c.describe}" if c is not None
                                        else "no layout fits it alone (the model needs the whole cluster)"))
    lines.append(f"{'(b) bound':12} {result.bound_tokens_per_s:12.0f}   (every chip at its efficiency matrix's best "
                 f"sustained rate on the model's FLOPs, no communication: no plan exceeds it)")
    lines += faster_part_lines(result)
    return "\n".join(lines)


def faster_part_lines(result) -> list[str]:
    """A warning per sub-cluster predicted faster alone (on the same global batch) than the whole cluster's
    plan: a plan places every rank, so a slower part whose communication and balance cost more than it adds
    still runs; `hal plan --only NAME` plans that part alone, the others idle."""
    mine = result.best.sim.tokens_per_s
    out = []
    for k, c in result.parts.items():
        if c is not None and c.sim.tokens_per_s > mine and len(result.parts) > 1:
            out.append(f"warning: sub-cluster {k} alone is predicted faster than this plan of the whole cluster "
                       f"({c.sim.tokens_per_s:,.0f} vs {mine:,.0f} tokens/s, x{c.sim.tokens_per_s / mine:.2f}): "
                       f"the search places every rank, and here the other parts cost more than they add. To leave "
                       f"them idle, plan {k} alone: hal plan ... --only {k}")
    return out
