"""The plan search's candidate generators, one per family of layouts:

  mixed stages  every pipeline stage holds TP groups of every chip kind (stage s takes the s-th
                p-th of each sub-cluster's TP groups), layers split evenly over identical stages,
                each micro-batch split over a stage's replicas by speed (water-filling on integer
                rows). DP gradients cross chips on the bridge.
  split stages  each sub-cluster forms its own stages (its own TP degree and stage count), the
                pipeline runs through the sub-clusters in turn, layers split by each stage's speed;
                DP never crosses chips.
  even          what `Plan.even` builds for every degree a homogeneous planner would try: the
                baseline a user would otherwise get.

Each yields `Candidate`s holding a `Shape` (search_shapes.py) and its closed-form estimate, with the
cheapest ZeRO level (and per-stage recompute) that fits memory.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Optional, Sequence

from ..schedule import Schedule
from .cost import ModelFacts, recompute_kind, replica_cost
from .facts import ChipFacts
from .layout import Layout
from .search_shapes import (ZERO_LEVELS, Group, Shape, divisors, ep_options, estimate, expert_share,
                            RECOMPUTE_TRIES, memory_options, recompute_text, runs_of, share_rows, split_layers)
from .simulate import SimResult


@dataclass
class Candidate:
    """One layout of a family with its closed-form estimate (and, once a finalist, its simulation)."""

    family: str
    layout: "Shape | Layout"      # a Shape while searched, its Layout once a finalist
    estimate_s: float
    describe: str
    sim: Optional[SimResult] = None


def tp_options(facts: Sequence[ChipFacts], model: ModelFacts, max_tp: int = 8) -> list[int]:
    """TP degrees every sub-cluster can use: dividing the heads, ffn and seq (sequence parallel)
    and each kind's node size and rank count."""
    out = []
    for t in (1, 2, 4, 8, 16):
        if t > max_tp or model.heads % t or model.cfg.kv_heads % t or model.ffn % t or model.seq % t:   # seq: SP
            continue
        if all(f.ranks_per_node % t == 0 and f.size % t == 0 for f in facts):
            out.append(t)
    return out


def mixed_candidates(facts: Sequence[ChipFacts], model: ModelFacts, batch: int, even: bool = False,
                     max_pp: int = 32) -> list[Candidate]:
    """Mixed-stage candidates: every (tp, pp, EP degree), layers split evenly (the last stage
    lighter by the head unless `even`), rows by speed (`even`: equal rows, experts split evenly)."""
    out = []
    for t in tp_options(facts, model):
        for p in divisors(math.gcd(*[f.size // t for f in facts])):
            if p > min(model.layers, max_pp):
                continue
            n_c = [f.size // t // p for f in facts]
            d = sum(n_c)
            unit = []
            for f in facts:      # one replica, one layer, one sample: the speed that splits rows
                c = replica_cost(model, f, t, 1, False, False, 1, False, 0, d, 1)
                unit.append(c.fwd + c.bwd)
            head_extra = 0.0 if even else model.head_fwd_flops() / model.layer_fwd_flops()
            counts = split_layers(model.layers, [1.0] * p, [0.0] * (p - 1) + [head_extra])
            if counts is None:
                continue
            bounds = list(itertools.accumulate([0] + counts))
            for ep in ep_options(model, n_c, even):
                out += _mixed_one(facts, model, batch, even, t, p, n_c, d, unit, bounds, ep)
    return out


def _mixed_one(facts: Sequence[ChipFacts], model: ModelFacts, batch: int, even: bool, t: int, p: int,
               n_c: list[int], d: int, unit: list[float], bounds: list[int],
               ep: Optional[int]) -> list[Candidate]:
    """Mixed-stage candidates of one (tp, pp, ep) over every micro-batch size."""
    out = []
    eshare = None
    if model.experts:
        if ep is not None:
            eshare = [(model.experts // ep, n) for n in n_c]
        elif even:
            eshare = [(model.experts // d, n) for n in n_c]
        else:
            eshare = expert_share(model.experts, n_c, [1.0 / u for u in unit])
            if eshare is None:
                return out
    for bm in divisors(batch):
        if bm < d or (even and bm % d):
            continue
        m = batch // bm
        if p > 1 and m < p:
            continue        # 1F1B needs at least as many micro-batches as stages (torch rule)
        rows = [(bm // d, n) for n in n_c] if even else share_rows(bm, n_c, unit)
        if rows is None:
            continue
        kinds = [runs_of(n, r[0], r[1], e[0] if e else None, e[1] if e else 0)
                 for n, r, e in zip(n_c, rows, eshare or [None] * len(n_c))]

        def build(zero: int, kinds=kinds, bounds=bounds, m=m, p=p, t=t) -> Shape:
            groups = [Group(f, t, mb, e, c) for f, runs in zip(facts, kinds) for mb, e, c in runs]
            return Shape([((bounds[s], bounds[s + 1]), groups) for s in range(p)], m, zero, ep=ep)

        counts = [b - a for a, b in zip(bounds, bounds[1:])]
        opts = [(v, Schedule.INTERLEAVED_1F1B if v > 1 else Schedule.ONE_F_ONE_B)
                for v in ((1,) if even else virtual_options(p, m, counts))]
        if not even and zbv_ok(p, counts):
            opts.append((2, Schedule.ZBV_ZERO_BUBBLE))
        for v, sched in opts:
            def build_v(zero: int, v=v, sched=sched, build=build) -> Shape:
                shape = build(zero)
                shape.virtual, shape.schedule = v, sched
                if sched == Schedule.ZBV_ZERO_BUBBLE:     # the head is on rank group 0: the lighter stage first
                    shape.stages = [(rng, g) for rng, (_, g) in zip(_reversed_ranges(counts), shape.stages)]
                return shape
            best = memory_options(build_v, model)
            if best is None:
                continue
            shape, est = best
            inter = ", ZBVZeroBubble (2 stages per rank in a V)" if sched == Schedule.ZBV_ZERO_BUBBLE else \
                f", interleaved x {v}" if v > 1 else ""
            out.append(Candidate("even" if even else "mixed", shape, est,
                                 f"mixed stages: tp {t}, pp {p}{inter}, dp {d}{_ep_text(model, ep, d)}, micro-batch "
                                 f"{bm} x {m}, zero {shape.zero}, {recompute_text(shape.recompute)}"))
    return out


def virtual_options(p: int, m: int, layers: Sequence[int]) -> list[int]:
    """Stages per rank group to try: 1 (1F1B) and, with p > 1 and m a multiple of p (torch's
    Interleaved1F1B needs m % max(1, m // p) == 0), every v in (2, 4, 8) no stage has fewer layers than
    (8: one layer per virtual stage of an 8-layer stage, as published Megatron-LM layouts use).
    Mixed stages only: torch's schedules need equal chains (every stage the same replicas and rows)."""
    out = [1]
    if p > 1 and m % p == 0:
        out += [v for v in (2, 4, 8) if min(layers) >= v]
    return out


def zbv_ok(p: int, layers: Sequence[int]) -> bool:
    """Whether torch's ZBVZeroBubble can run a mixed-stage layout of p rank groups with `layers` each:
    p > 1 and every rank group at least 2 layers (its two V stages). torch asks nothing of the
    micro-batch count (it lays out max(2p - 1, M) and drops the rest); the search's m >= p holds.
    Mixed stages only: torch's schedules need equal chains (every stage the same replicas and rows)."""
    return p > 1 and min(layers) >= 2


def _reversed_ranges(counts: Sequence[int]) -> list[tuple[int, int]]:
    """Layer ranges of stages holding `counts` layers in reverse order (the last count first)."""
    bounds = list(itertools.accumulate([0] + list(counts)[::-1]))
    return list(zip(bounds, bounds[1:]))


def _ep_text(model: ModelFacts, ep: Optional[int], d: int) -> str:
    """The EP part of a candidate's description ("" for a dense model)."""
    if not model.experts:
        return ""
    return f", ep {ep} (x {d // ep} expert-DP)" if ep is not None else f", ep {d} (= dp)"


def even_candidates(facts: Sequence[ChipFacts], model: ModelFacts, batch: int, max_pp: int = 32) -> list[Candidate]:
    """What `Plan.even(topology, cfg, batch, m, pp, tp, zero, recompute)` builds, for every degree a
    homogeneous planner would try: stages of contiguous ranks, TP groups of contiguous ranks, equal
    layers (earlier stages one more), equal rows per replica, one recompute setting for all stages,
    experts split evenly. The best of these is the baseline a user would otherwise get."""
    world = sum(f.size for f in facts)
    starts = [f.ranks[0] for f in facts]
    out = []
    for t in tp_options(facts, model):
        for p in divisors(world // t):
            if p > min(model.layers, max_pp):
                continue
            per = world // p
            stages_groups, ok = [], True
            for s in range(p):
                a, b = s * per, (s + 1) * per
                groups = []
                for f, st in zip(facts, starts):
                    n = max(0, min(b, st + f.size) - max(a, st))
                    if n % t:
                        ok = False
                    if n:
                        groups.append((f, n // t))
                stages_groups.append(groups)
            if not ok:
                continue
            d = per // t
            base, extra = divmod(model.layers, p)
            counts = [base + (1 if s < extra else 0) for s in range(p)]
            bounds = list(itertools.accumulate([0] + counts))
            for bm, ep in itertools.product(divisors(batch), ep_options(model, [d], even=True)):
                if bm % d or (p > 1 and batch // bm < p):
                    continue
                m = batch // bm
                e = model.experts // (ep or d) if model.experts else None
                best = None
                for recompute in RECOMPUTE_TRIES:
                    for zero in ZERO_LEVELS:
                        shape = Shape([((bounds[s], bounds[s + 1]), [Group(f, t, bm // d, e, n) for f, n in g])
                                       for s, g in enumerate(stages_groups)], m, zero, [recompute] * p, ep=ep)
                        est, fits = estimate(shape, model, uniform=True)
                        if fits and (best is None or est < best[1]):
                            best = (shape, est)
                    if best:
                        break
                if best is None:
                    continue
                shape, est = best
                out.append(Candidate("even", shape, est, f"Plan.even: tp {t}, pp {p}, dp {d}{_ep_text(model, ep, d)}, "
                                                        f"micro-batch {bm} x {m}, "
                                                        f"zero {shape.zero}, "
                                                        f"recompute {recompute_kind(shape.recompute[0])}"))
    return out


def _split_options(facts: Sequence[ChipFacts], model: ModelFacts, max_pp: int,
                   solo: Optional[dict[str, "Candidate"]]) -> list[list[tuple[int, int]]]:
    """Per sub-cluster, the (TP degree, stage count) pairs the split family tries: with its best
    layout alone (`solo`), its TP degree within a factor 2 and the three stage counts nearest to
    (its stage count alone) x (its share of the cluster's speed); else every option."""
    per_kind = []
    speed = [f.flops * f.size for f in facts]
    for f, sp in zip(facts, speed):
        tps = tp_options([f], model)
        target_p = None
        if solo and f.name in solo:
            st0 = solo[f.name].layout.stages
            t0 = len(st0[0].reps[0].ranks)
            tps = [t for t in tps if t0 / 2 <= t <= t0 * 2]
            target_p = max(1.0, len(st0) * sp / sum(speed))
        opts = []
        for t in tps:
            pcs = [pc for pc in divisors(f.size // t) if pc <= max_pp and pc <= model.layers]
            if target_p is not None:
                pcs = sorted(pcs, key=lambda pc: abs(math.log(pc / target_p)))[:3]
            opts += [(t, pc) for pc in pcs]
        per_kind.append(opts)
    return per_kind


def split_candidates(facts: Sequence[ChipFacts], model: ModelFacts, batch: int, max_pp: int = 32,
                     max_bm: int = 4, solo: Optional[dict[str, "Candidate"]] = None) -> list[Candidate]:
    """Each sub-cluster its own stages (own TP and stage count), in spec order.

    Pruned around each sub-cluster's best layout alone (`solo`): its TP degree and the neighbouring
    ones, and stage counts near (its stage count alone) x (its share of the cluster's speed), since
    in the whole cluster's pipeline it holds only that share of the layers. Without `solo` every
    option is tried."""
    if len(facts) < 2:
        return []
    out = []
    for combo in itertools.product(*_split_options(facts, model, max_pp, solo)):
        p = sum(pc for _, pc in combo)
        if p > min(max_pp, model.layers):
            continue
        dc = [f.size // (t * pc) for f, (t, pc) in zip(facts, combo)]
        bms = [bm for bm in divisors(batch) if bm >= max(dc) and batch // bm >= p][:max_bm]
        for bm, ep in itertools.product(bms, ep_options(model, dc) if model.experts else [None]):
            m = batch // bm
            rows = [(bm // d, d - bm % d) for d in dc]          # even inside a kind
            eshare = None
            if model.experts:
                if ep is None and any(model.experts < d for d in dc):
                    continue
                eshare = [(model.experts // (ep or d), d - model.experts % (ep or d)) for d in dc]
            per_layer, extra, stage_kind = [], [], []
            for ki, (f, (t, pc)) in enumerate(zip(facts, combo)):
                c = replica_cost(model, f, t, 1, False, False, rows[ki][0] + (rows[ki][1] < dc[ki]), False, 0,
                                 dc[ki], 1, experts_local=eshare[ki][0] if eshare else None,
                                 group_mb=bm if ep is None else (bm // dc[ki]) * ep)
                per_layer += [c.fwd + c.bwd] * pc
                extra += [0.0] * pc
                stage_kind += [ki] * pc
            kl = stage_kind[-1]
            extra[-1] = model.head_fwd_flops() * (rows[kl][0] + 1) * 3 / (facts[kl].flops * combo[kl][0])
            counts = split_layers(model.layers, per_layer, extra)
            if counts is None:
                continue
            bounds = list(itertools.accumulate([0] + counts))
            kinds = [runs_of(d, r[0], r[1], e[0] if e else None, e[1] if e else 0)
                     for d, r, e in zip(dc, rows, eshare or [None] * len(dc))]

            def build(zero: int, kinds=kinds, bounds=bounds, m=m, combo=combo,
                      stage_kind=stage_kind, ep=ep) -> Shape:
                stages = []
                for s, ki in enumerate(stage_kind):
                    stages.append(((bounds[s], bounds[s + 1]),
                                   [Group(facts[ki], combo[ki][0], mb, e, c) for mb, e, c in kinds[ki]]))
                return Shape(stages, m, zero, ep=ep)

            best = memory_options(build, model)
            if best is None:
                continue
            shape, est = best
            desc = ", ".join(f"{f.name}: tp {t} x {pc} stages x dp {d}" for f, (t, pc), d in zip(facts, combo, dc))
            ept = "" if not model.experts else (f", ep {ep}" if ep else ", ep = dp")
            out.append(Candidate("split", shape, est, f"split stages ({desc}){ept}, micro-batch {bm} x {m}, "
                                                      f"zero {shape.zero}, {recompute_text(shape.recompute)}"))
    return out
