"""The plan search: candidate layouts scored in closed form, finalists scored by the step simulator.

  search_families.py  the candidate generators: mixed stages (every stage holds every chip kind,
                      rows split by speed; DP crosses chips on the bridge), split stages (each
                      sub-cluster its own stages and TP degree, layers split by speed; DP never
                      crosses chips), and the even layouts `Plan.even` builds (the baseline)
  search_shapes.py    a layout without ranks (`Shape`) and its closed-form 1F1B score, the integer
                      splits of layers, rows and experts
  this module         the finalists: `materialize` gives a shape its ranks, `finalize` simulates the
                      best few of a family (`simulate.simulate`); `search` plans each sub-cluster
                      alone (the ideal), then the whole cluster, and the best simulated plan that
                      fits memory wins (the even layouts compete, so it is never worse than them)

Search space: TP degree (a divisor of the node size and of the heads), pipeline depth (a divisor
of every sub-cluster's TP-group count for mixed stages; per sub-cluster for split stages), the
micro-batch size (a divisor of the global batch, hence the micro-batch count), ZeRO level (0, 2, 3)
and full recompute, chosen per candidate as the cheapest that fits memory. The closed form costs
the number of divisors, not the number of ranks.

Ideas from the public literature, reimplemented: heterogeneity-aware layer and batch splitting by
device speed (Metis, HETHUB, FlagScale's hetero mode), pruning by memory before timing (Alpa, Sailor),
closed-form scoring of a large space and simulation of finalists (Calculon, Proteus).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Union

from hal.contract.errors import HalError

from ..schedule import Schedule
from .cost import ModelFacts, recompute_kind
from .facts import ChipFacts, with_rails
from .layout import Layout, RepSpec, StageSpec
from .search_families import Candidate, even_candidates, mixed_candidates, split_candidates
from .search_shapes import (Group, Shape, ep_of, ep_options, estimate, expert_reduce_time, place_experts,
                            split_layers)
from .simulate import simulate

# what callers import from here (the search's pieces live in search_shapes / search_families)
__all__ = ["search", "SearchResult", "PlanSearchError", "Candidate", "Shape", "Group", "materialize",
           "finalize", "bound_tokens_per_s", "mixed_candidates", "split_candidates", "even_candidates",
           "split_layers", "place_experts", "ep_of", "ep_options", "estimate", "expert_reduce_time",
           "OverAllocated", "OVERALLOCATED_DROPS"]


@dataclass
class SearchResult:
    """The chosen layout, the best even one, each sub-cluster alone on the same global batch, every
    finalist, and the two efficiency references (docs/planner.md, "Efficiency"):

      (a) `efficiency` = tokens/s / the sum of each sub-cluster's best predicted tokens/s ALONE on the
          same global batch (what `hal train --measure-parts` measures); None when some part cannot
          hold the model alone (`parts[name]` is None);
      (b) `bound_efficiency` = tokens/s / `bound_tokens_per_s`: every chip at its efficiency matrix's
          best sustained rate on the model's FLOPs, no communication, no bubble, no memory-bound
          work. No plan can exceed it (each op is charged at most at that rate)."""

    best: Candidate
    even: Optional[Candidate]
    parts: dict[str, Optional[Candidate]]   # sub-cluster name -> its best plan alone (None: none fits)
    evaluated: int
    search_s: float
    finalists: list[Candidate] = field(default_factory=list)
    # finalists `materialize` refused (OverAllocated) in this search: 0 unless a generator is wrong
    overallocated: int = 0
    bound_tokens_per_s: float = 0.0

    @property
    def parts_tokens_per_s(self) -> Optional[float]:
        if not self.parts or any(c is None for c in self.parts.values()):
            return None
        return sum(c.sim.tokens_per_s for c in self.parts.values() if c is not None)

    @property
    def efficiency(self) -> Optional[float]:
        ref = self.parts_tokens_per_s
        return self.best.sim.tokens_per_s / ref if ref else None

    @property
    def bound_efficiency(self) -> float:
        return self.best.sim.tokens_per_s / self.bound_tokens_per_s

    @property
    def even_efficiency(self) -> Optional[float]:
        ref = self.parts_tokens_per_s
        if self.even is None or not self.even.sim.fits or not ref:
            return None
        return self.even.sim.tokens_per_s / ref

    @property
    def even_bound_efficiency(self) -> Optional[float]:
        if self.even is None or not self.even.sim.fits:
            return None
        return self.even.sim.tokens_per_s / self.bound_tokens_per_s


def bound_tokens_per_s(facts: Sequence[ChipFacts], model: ModelFacts) -> float:
    """(b)'s reference: the cluster's best sustained FLOP/s (each chip at its matrix's best fraction of
    peak) over the model's training FLOPs per token (no recompute), attention's at what a fused causal
    kernel really does of them (cost.bound_flops_per_sample), so that no plan exceeds it."""
    from .cost import bound_flops_per_sample
    return sum(f.size * f.flops for f in facts) * model.seq / bound_flops_per_sample(facts, model)


def _groups(f: ChipFacts, t: int) -> list[tuple[int, ...]]:
    """A sub-cluster's TP groups of t consecutive ranks."""
    return [tuple(f.ranks[i:i + t]) for i in range(0, f.size, t)]


class OverAllocated(ValueError):
    """A shape needs more TP groups of a sub-cluster than it has (materialize); never a finalist."""


# How often `finalize` dropped an OverAllocated shape, per family, since import: a defensive check,
# the generators should produce none (tests/test_planner_search.py asserts it).
OVERALLOCATED_DROPS: dict[str, int] = {}


def _stage_recompute(r) -> object:
    """A shape's recompute flag as a StageSpec holds it (convert.from_plan's convention): False for none,
    True for full, "selective" kept as the name (bool() of it would price selective as full)."""
    k = recompute_kind(r)
    return False if k == "none" else True if k == "full" else k


def materialize(shape: Shape, node_of=None, schedule: Union[Schedule, str] = Schedule.ONE_F_ONE_B) -> Layout:
    """Give a shape its ranks: each kind's TP groups are consecutive ranks of its sub-cluster, taken
    in order by the stages that use that kind (stage order), replicas in the shape's group order."""
    used: dict[str, int] = {}
    stages = []
    for si, ((a, b), groups) in enumerate(shape.stages):
        reps = []
        for g in groups:
            tps = _groups(g.facts, g.tp)
            for _ in range(g.count):
                k = used.get(g.facts.name, 0)
                used[g.facts.name] = k + 1
                if k >= len(tps):
                    raise OverAllocated(f"shape asks for TP group {k + 1} of sub-cluster {g.facts.name!r}, which "
                                        f"has {len(tps)} of tp {g.tp} ({g.facts.size} ranks)")
                reps.append(RepSpec(g.facts, tps[k], g.mb, g.experts))
        stages.append(StageSpec((a, b), reps, _stage_recompute(shape.recompute[si] if shape.recompute else False),
                                ep=shape.ep if g.experts is not None else None))
    if shape.virtual > 1:        # the search's multi-stage pick: Interleaved1F1B or ZBVZeroBubble
        schedule = Schedule.ZBV_ZERO_BUBBLE if shape.schedule == Schedule.ZBV_ZERO_BUBBLE else Schedule.INTERLEAVED_1F1B
    return Layout(stages=stages, m=shape.m, zero=shape.zero, schedule=schedule, node_of=node_of,
                  virtual=shape.virtual)


def finalize(cands: list[Candidate], model: ModelFacts, keep: int, node_of=None) -> list[Candidate]:
    """The `keep` best-estimated candidates given ranks and simulated, those that fit first, by
    simulated step time (all of them when none fits). ZBVZeroBubble candidates are ranked apart, half
    as many besides: their closed form is another formula than 1F1B's, and they must not push out of
    the finalists a layout the search would have simulated without them (with one list the
    published-run benchmark's llama3-405b-8192 pick fell 1.3%)."""
    zbv = [c for c in cands if getattr(c.layout, "schedule", None) == Schedule.ZBV_ZERO_BUBBLE]
    rest = [c for c in cands if getattr(c.layout, "schedule", None) != Schedule.ZBV_ZERO_BUBBLE]
    cands = sorted(rest, key=lambda c: c.estimate_s)[:keep] + \
        sorted(zbv, key=lambda c: c.estimate_s)[:max(1, keep // 2)]
    placed = []
    for c in cands:
        try:
            c.layout = materialize(c.layout, node_of)
        except OverAllocated:
            # a shape that uses more TP groups of a kind than it has is not a layout: dropped, counted
            OVERALLOCATED_DROPS[c.family] = OVERALLOCATED_DROPS.get(c.family, 0) + 1
            continue
        c.sim = simulate(c.layout, model)
        placed.append(c)
    cands = placed
    return sorted([c for c in cands if c.sim.fits], key=lambda c: c.sim.step_time_s) or cands


def _plan_parts(facts: Sequence[ChipFacts], model: ModelFacts, batch: int, node_of, max_pp: int, keep: int,
                say: Callable[[str], None]) -> tuple[dict[str, Optional[Candidate]], int]:
    """(each sub-cluster's best layout alone on the whole global batch, or None where none fits;
    candidates evaluated): (a)'s reference, the definition `hal train --measure-parts` measures."""
    evaluated = 0
    parts: dict[str, Optional[Candidate]] = {}
    for f in facts:
        say(f"planning {f.name} alone ({f.size} x {f.model}, the whole global batch {batch})")
        cs = mixed_candidates([f], model, batch, max_pp=max_pp)
        evaluated += len(cs)
        got = [c for c in finalize(cs, model, keep, node_of) if c.sim.fits]
        parts[f.name] = got[0] if got else None
    return parts, evaluated


def search(facts: Sequence[ChipFacts], model: ModelFacts, batch: int, node_of=None, max_pp: int = 32,
           keep: int = 8, progress: Optional[Callable[[str], None]] = None, topology=None,
           only_schedule: Optional[str] = None) -> SearchResult:
    """Best layout for the whole cluster, the best even layout, and each sub-cluster planned alone on
    the same global batch (a part that cannot hold the model alone is None: the cluster is still
    planned, its parts pipelined together, and reported against the bound).
    With `topology` (hal.core.topology.Topology) traffic across sub-clusters is priced on its rail
    bandwidth (facts.with_rails); without, on the slowest NIC of the parts. `keep`: finalists simulated per
    family (8: with 6, a better NIC on a 4 + 4 mixed cluster dropped the best layout out of the closed
    form's top 6 and the search returned an 8% slower plan; tests/test_planner_efficiency.py).
    `only_schedule` (Interleaved1F1B or ZBVZeroBubble): only mixed-stage layouts on that schedule
    compete for the cluster (the parts and the even baseline are planned as always)."""
    t0 = time.perf_counter()
    drops0 = sum(OVERALLOCATED_DROPS.values())
    if topology is not None:
        facts = with_rails(list(facts), topology)
    say = progress or (lambda msg: None)
    if len(facts) == 1:      # one sub-cluster: the part alone is the cluster (searched below)
        parts, evaluated = {}, 0
    else:
        parts, evaluated = _plan_parts(facts, model, batch, node_of, max_pp, keep, say)
    say("searching mixed-stage layouts")
    mixed = mixed_candidates(facts, model, batch, max_pp=max_pp)
    say(f"searching split-stage layouts ({len(mixed)} mixed candidates so far)")
    solo = {k: c for k, c in parts.items() if c is not None}
    split = split_candidates(facts, model, batch, max_pp=max_pp, solo=solo) if only_schedule is None else []
    if only_schedule is not None:
        mixed = [c for c in mixed if c.layout.virtual > 1 and c.layout.schedule == only_schedule]
    evaluated += len(mixed) + len(split)
    say(f"scoring even layouts ({len(mixed) + len(split)} candidates so far)")
    ev = even_candidates(facts, model, batch, max_pp=max_pp)
    evaluated += len(ev)
    say(f"simulating finalists of {len(mixed) + len(split) + len(ev)} candidates")
    ev_fin = finalize(ev, model, keep, node_of)
    even = ev_fin[0] if ev_fin and ev_fin[0].sim.fits else None
    # the even layouts compete too: the planner never returns worse than what a user would get
    fin = finalize(mixed, model, keep, node_of) + finalize(split, model, keep, node_of) + \
        (ev_fin if only_schedule is None else [])
    fin = sorted([c for c in fin if c.sim and c.sim.fits], key=lambda c: c.sim.step_time_s)
    if not fin:
        only = f" on schedule {only_schedule}" if only_schedule is not None else ""
        raise PlanSearchError(f"no layout of {model.name}{only} fits this cluster with global batch {batch} "
                              f"(usable memory per device: "
                              + ", ".join(f"{f.name} {f.memory / 1e9:.1f} GB" for f in facts) + ")")
    if len(facts) == 1:
        parts = {facts[0].name: fin[0]}
    return SearchResult(best=fin[0], even=even, parts=parts, evaluated=evaluated,
                        search_s=time.perf_counter() - t0, finalists=fin,
                        overallocated=sum(OVERALLOCATED_DROPS.values()) - drops0,
                        bound_tokens_per_s=bound_tokens_per_s(facts, model))


class PlanSearchError(HalError, ValueError):
    """No layout fits: the message names the model, the cluster part and the batch."""
