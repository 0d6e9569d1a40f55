"""The step simulator's reduction model: when a stage's data-parallel gradient reduction ends, as
apply_plan runs it at each ZeRO level, and the step's loss all-reduce before the optimizer.

  ZeRO 0, no TP   torch DDP: 1 MiB buckets reduced during the last backward, the last bucket's share
                  exposed; the reducer copies the reduced buckets back into .grad afterwards.
  ZeRO 0, TP      one flat all_reduce after the pipeline (cat, reduce, copy back), not overlapped.
  ZeRO >= 1       FSDP2: a reduce-scatter per layer during the last backward, the last layer's
                  exposed, then each reduced shard copied into .grad.
Expert parameters are left out of DDP / FSDP2: with expert data parallel their copies (one per EP
group) SUM-reduce after the dense gradients.
"""
from __future__ import annotations

import math

from .cost import GRAD_BYTES, ModelFacts, ReplicaCost, dp_reduce_time, group_bw
from .layout import Layout, StageSpec, on_one_node

DDP_BUCKET_BYTES = 2**20   # apply_plan's DDP bucket cap (hal.strategies.apply._apply_dp: bucket_cap_mb=1.0)


def _reduce_seconds(layout: Layout, model: ModelFacts, st: StageSpec, c0: ReplicaCost) -> tuple[float, float]:
    """(dense parameters reduced per rank, seconds of the stage's gradient all-reduce). Each chip
    kind of the DP group reduces on its intra link when its replicas share a node, else the NIC;
    several kinds use the bridge's rail algorithm (cost.dp_reduce_time). Expert copies (one per EP
    group, on other nodes) reduce their gradients after the dense ones, on the NIC / the bridge."""
    params = c0.params_local
    eparams = 0.0
    if model.experts:   # expert weights live once in the EP group: not DP-reduced
        eparams = c0.expert_params_local     # whole on each TP rank (cost.py)
        params -= eparams
    parts: dict[str, list] = {}
    for r in st.reps:
        parts.setdefault(r.facts.name, [r.facts, 0, None])[1] += 1
    plist = []
    for f, n, _ in parts.values():
        members = [x.ranks[0] for x in st.reps if x.facts.name == f.name]
        plist.append((f, n, group_bw(f, on_one_node(members, layout.node_of or {}))))
    t_red = dp_reduce_time(max(params, 0) * GRAD_BYTES, plist)
    if st.ep is not None and len(st.reps) // st.ep > 1 and eparams:
        eparts: dict[str, list] = {}
        for r in st.reps[::st.ep]:
            eparts.setdefault(r.facts.name, [r.facts, 0, r.facts.nic_bw])[1] += 1
        t_red += dp_reduce_time(eparams * GRAD_BYTES, [tuple(v) for v in eparts.values()])
    return params, t_red


def reduction_end(layout: Layout, model: ModelFacts, costs: list[list[ReplicaCost]], s: int,
                  last_b_start: float, last_b_end: float) -> tuple[float, bool]:
    """(when stage s's DP reduction ends, whether it runs inside the last backward), given the
    latest start and end of its replicas' last backward. DDP's and FSDP2's reductions run in
    autograd's hooks and final callback (inside backward); apply_plan's TP stages at ZeRO 0 reduce
    after the pipeline instead. Without DP the stage ends with its last backward."""
    st = layout.stages[s]
    dp = len(st.reps)
    if dp <= 1:
        return last_b_end, False
    params, t_red = _reduce_seconds(layout, model, st, costs[s][0])
    params = max(params, 0)
    mem_bw = min(x.facts.memory_bw for x in st.reps)
    tp = len(st.reps[0].ranks)
    if layout.zero == 0 and tp == 1:
        # DDP: the last bucket (1 / buckets of it, at most 1 / layers) is exposed; the copy-in ran
        # inside the backward (sim_costs._ddp_copy_in), the copy back (a copy_: dst + src read, dst
        # written) follows the reduction
        nb = max(1, min(st.n_layers, math.ceil(params * GRAD_BYTES / DDP_BUCKET_BYTES)))
        copy_back = params * GRAD_BYTES * 3 / mem_bw
        red_end = max(last_b_start + t_red, last_b_end + t_red / nb) + copy_back
    elif layout.zero == 0:
        # TP stages: apply_plan's _sum_grads (cat, all_reduce, copy back) after the pipeline
        copies = params * GRAD_BYTES * 5 / mem_bw
        red_end = last_b_end + t_red + copies
    else:
        # FSDP2: the last layer's reduce-scatter exposed, then each reduced shard copied into .grad
        copy_out = 3 * params * model.dtype_bytes / dp / mem_bw
        red_end = max(last_b_start + t_red, last_b_end + t_red / max(st.n_layers, 1)) + copy_out
    return red_end, not (layout.zero == 0 and tp > 1)


def loss_allreduce_seconds(layout: Layout) -> float:
    """The step's loss (one fp32) all-reduced over the world before the optimizer (apply_plan's
    step): every rank waits there for the slowest stage's reduction."""
    world_parts: dict[str, list] = {}
    for st in layout.stages:
        for rep in st.reps:
            world_parts.setdefault(rep.facts.name, [rep.facts, 0, rep.facts.nic_bw])[1] += len(rep.ranks)
    return dp_reduce_time(4.0, [tuple(v) for v in world_parts.values()])
