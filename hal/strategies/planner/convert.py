"""Between the planner's `Layout` (replicas with chip figures) and the `Plan` the strategies run."""
from __future__ import annotations

from typing import Sequence

from ..plan import Plan, Replica, Stage
from ..schedule import Schedule
from .facts import ChipFacts
from .layout import Layout, RepSpec, StageSpec


def to_plan(layout: Layout, model_name: str, schedule: Schedule | str = Schedule.ONE_F_ONE_B) -> Plan:
    """The Plan of a layout: experts are numbered consecutively over each EP group's replicas (the
    stage's replicas when `StageSpec.ep` is None; else blocks of ep replicas, each numbered alike)."""
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
                            recompute="full" if st.recompute else "none", experts=experts,
                            ep=st.ep if experts is not None else None))
    return Plan(model=model_name, num_microbatches=layout.m, schedule=schedule, zero=layout.zero, stages=stages)


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
        stages.append(StageSpec(tuple(st.layers), reps, st.recompute == "full", ep=st.ep))
    return Layout(stages=stages, m=plan.num_microbatches, zero=plan.zero, schedule=plan.schedule, node_of=node_of)
