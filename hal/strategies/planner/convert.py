"""Between the planner's `Layout` (replicas with chip figures) and the `Plan` the strategies run."""
from __future__ import annotations

from typing import Sequence

from ..plan import Plan, Replica, Stage
from ..schedule import Schedule
from .cost import recompute_kind
from .facts import ChipFacts
from .layout import Layout, RepSpec, StageSpec
from .sim_chain import chunk_layers


def to_plan(layout: Layout, model_name: str, schedule: Schedule | str = Schedule.ONE_F_ONE_B) -> Plan:
    """The Plan of a layout: experts are numbered consecutively over each EP group's replicas (the
    stage's replicas when `StageSpec.ep` is None; else blocks of ep replicas, each numbered alike).
    An interleaved layout (`virtual` v > 1) becomes p v plan stages on torch's Interleaved1F1B: rank
    group s's layers cut into v chunks, plan stage c p + s its chunk c, layers contiguous in stage order.
    A ZBVZeroBubble layout (virtual 2) becomes 2p plan stages in a V: rank group s's chunk 0 is plan
    stage s, its chunk 1 plan stage 2p - 1 - s (plan.py's and torch's V placement)."""
    if layout.virtual > 1:
        return _interleaved_plan(layout, model_name)
    stages = []
    for st in layout.stages:
        experts = None
        if st.reps and st.reps[0].experts is not None:
            experts, nxt = [], 0
            ep = st.ep or len(st.reps)
            for j, r in enumerate(st.reps):
                nxt = 0 if j % ep == 0 else nxt
                experts.append(list(range(nxt, nxt + r.experts)))
                nxt += r.experts
        stages.append(Stage(layers=st.layers, replicas=[Replica(ranks=list(r.ranks), microbatch=r.mb) for r in st.reps],
                            recompute=recompute_kind(st.recompute), experts=experts,
                            ep=st.ep if experts is not None else None))
    return Plan(model=model_name, num_microbatches=layout.m, schedule=schedule, zero=layout.zero, stages=stages)


def stage_placement(layout: Layout) -> list[tuple[int, tuple[int, int]]]:
    """A multi-stage layout's plan stages in order: (rank group, layer range [a, b)). Interleaved1F1B:
    stage c p + s is group s's chunk c; ZBVZeroBubble's V: stages 0..p-1 are the groups' chunk 0,
    p..2p-1 their chunk 1 in reverse. Each group's layers cut by `sim_chain.chunk_layers`, the ranges
    contiguous in stage order."""
    v, p = layout.virtual, len(layout.stages)
    zbv = layout.schedule == Schedule.ZBV_ZERO_BUBBLE
    chunks = [chunk_layers(st.n_layers, v) for st in layout.stages]
    out, start = [], 0
    for i in range(p * v):
        c, s = divmod(i, p)
        if zbv:
            c, s = (0, i) if i < p else (1, 2 * p - 1 - i)
        out.append((s, (start, start + chunks[s][c])))
        start += chunks[s][c]
    return out


def _interleaved_plan(layout: Layout, model_name: str) -> Plan:
    plain = to_plan(Layout(stages=layout.stages, m=layout.m, zero=layout.zero, node_of=layout.node_of),
                    model_name)
    stages = [plain.stages[s].model_copy(update={"layers": rng}) for s, rng in stage_placement(layout)]
    zbv = layout.schedule == Schedule.ZBV_ZERO_BUBBLE
    return Plan(model=model_name, num_microbatches=layout.m,
                schedule=Schedule.ZBV_ZERO_BUBBLE if zbv else Schedule.INTERLEAVED_1F1B, zero=layout.zero,
                stages=stages)


def from_plan(plan: Plan, facts: Sequence[ChipFacts], node_of=None) -> Layout:
    """The layout of a given plan, each replica with the figures of its ranks' sub-cluster."""
    by_rank = {r: f for f in facts for r in f.ranks}
    stages = []
    for si, st in enumerate(plan.stages):
        reps = []
        for j, rep in enumerate(st.replicas):
            f = by_rank.get(rep.ranks[0])
            if f is None:
                raise ValueError(f"stages[{si}].replicas[{j}].ranks[0] = {rep.ranks[0]} is not a rank of the cluster "
                                 f"(world {sum(x.size for x in facts)})")
            reps.append(RepSpec(f, tuple(rep.ranks), rep.microbatch,
                                len(st.experts[j]) if st.experts is not None else None))
        stages.append(StageSpec(tuple(st.layers), reps, st.recompute if st.recompute != "none" else False, ep=st.ep))
    if plan.schedule in (Schedule.INTERLEAVED_1F1B, Schedule.ZBV_ZERO_BUBBLE):
        return _collapse(stages, plan, node_of)
    return Layout(stages=stages, m=plan.num_microbatches, zero=plan.zero, schedule=plan.schedule, node_of=node_of)


def _collapse(stages: list[StageSpec], plan: Plan, node_of) -> Layout:
    """An Interleaved1F1B plan's stages, v per rank group round-robin (or a ZBVZeroBubble plan's, 2 per
    rank group in a V), as one StageSpec per rank group holding all its layers (the simulator prices a
    rank group's work; `virtual` = v)."""
    keys = [tuple(r.ranks for r in st.reps) for st in stages]
    groups = list(dict.fromkeys(keys))
    p = len(groups)
    v = len(stages) // p
    out = []
    for s in range(p):
        mine = [st for st, k in zip(stages, keys) if k == groups[s]]
        n = sum(st.n_layers for st in mine)
        out.append(StageSpec((mine[0].layers[0], mine[0].layers[0] + n), mine[0].reps, mine[0].recompute,
                             ep=mine[0].ep))
    return Layout(stages=out, m=plan.num_microbatches, zero=plan.zero, schedule=plan.schedule, node_of=node_of,
                  virtual=v)
