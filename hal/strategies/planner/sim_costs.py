"""The step simulator's first stage: what each operation of the step costs.

Per replica, its forward / backward seconds per micro-batch and memory (`stage_costs`, from
cost.replica_cost), the queue of operations its schedule runs with every second added to each
(`op_queues`: compute, DDP's bucket copy-in, FSDP2's own copies), and the seconds of every
pipeline send between consecutive stages (`send_times`). The event pass (sim_events.py) only adds
these numbers up along the schedule's dependencies.
"""
from __future__ import annotations

import copy

from ..schedule import Schedule, stage_order
from .cost import GRAD_BYTES, ModelFacts, ReplicaCost, gather_time, group_bw, p2p_time, replica_cost
from .layout import Layout, RepSpec, StageSpec, on_one_node, outputs_alive, stage_ends
from .layout import in_flight as layout_in_flight
from .sim_chain import chunk_layers


def fsdp_copy_bytes(dense: float, ends: float, d: int, zero: int, kind: str, j: int, m: int) -> float:
    """Bytes of FSDP2's own copies (apply_plan's zero >= 1: fully_shard per block and the stage)
    in micro-batch j's forward (kind "F") / backward ("B") of a replica, P = `dense`, its dense
    parameter bytes (`ends`: those of the embedding / head, never resharded), d = the DP degree.
    HeteroPipeline keeps the parameters gathered between micro-batches
    (set_reshard_after_backward(last)), so the first forward gathers them: all_gather_copy_in
    ((2 + 2/d) P counted: shards read, buffer written) and split_with_sizes_copy out of the buffer
    (2P); ZeRO-3 reshards after each forward, so every backward gathers the blocks again (the root
    stays gathered); the last backward packs the gradients for the reduce-scatter (chunk_cat, 2P)
    before the stage's input gradient exists. tests/test_planner_runtime_copies.py counts these op
    by op on the real wrappers. The reduced shard's copy into .grad (3P/d) runs after backward
    (sim_reduction.py)."""
    if kind == "F":
        return (4 + 2 / d) * dense if j == 0 else 0.0
    regather = (4 + 2 / d) * max(dense - ends, 0.0) if zero == 3 else 0.0
    return regather + (2 * dense if j == m - 1 else 0.0)


def simulated_schedule(layout: Layout) -> Schedule:
    """The order the event pass (sim_events.py) replays: GPipe as GPipe, every other schedule as
    1F1B (Interleaved1F1B is then corrected in simulate.py). ZBVZeroBubble is not replayed here:
    sim_chain.py replays torch's own order for it."""
    return Schedule.GPIPE if layout.schedule == Schedule.GPIPE else Schedule.ONE_F_ONE_B


def _ep_args(model: ModelFacts, st: StageSpec, j: int, nic: float, node_of, grp_memo: dict) -> tuple:
    """(EP argument of replica_cost, rows its EP group routes per micro-batch) for replica j.

    EP bandwidth is per rank: each TP rank moves all its replica's tokens (cost._replica_cost).
    Without `st.ep` one EP group spans the stage (on its slowest NIC); with it, EP groups of st.ep
    consecutive replicas run their all_to_all on the intra link when their ranks share a node, else
    the NIC, and their experts see the group's rows. `grp_memo` caches each group's (rows, one node)."""
    r, dp = st.reps[j], len(st.reps)
    ep, gmb = ((dp, nic) if model.experts and dp > 1 else None), st.microbatch
    if model.experts and st.ep is not None:
        gi = j // st.ep
        if gi not in grp_memo:
            grp = st.reps[gi * st.ep:(gi + 1) * st.ep]
            grp_memo[gi] = (sum(x.mb for x in grp), on_one_node([x for g in grp for x in g.ranks], node_of))
        gmb, one = grp_memo[gi]
        ep = (st.ep, group_bw(r.facts, one)) if st.ep > 1 else None
    return ep, gmb


def _stage_row(layout: Layout, model: ModelFacts, s: int) -> list[ReplicaCost]:
    """ReplicaCost of every replica of stage s. Replicas of one kind and share cost the same: they
    share one (copied) object, computed once."""
    st, p, m = layout.stages[s], len(layout.stages), layout.m
    row, memo, grp_memo = [], {}, {}
    dp = len(st.reps)
    nic = min(x.facts.nic_bw for x in st.reps)
    chunks = layout.chunks[s] if layout.chunks else chunk_layers(st.n_layers, layout.virtual)
    in_flight = m if simulated_schedule(layout) == Schedule.GPIPE else \
        layout_in_flight(m, p, s, layout.virtual, layout.schedule, chunks, layout.per_round)
    first, last = stage_ends(s, p, layout.schedule)
    for j, r in enumerate(st.reps):
        ep, gmb = _ep_args(model, st, j, nic, layout.node_of or {}, grp_memo)
        key = (r.facts.name, len(r.ranks), r.mb, r.experts, ep, gmb)
        if key not in memo:
            memo[key] = copy.copy(replica_cost(model, r.facts, len(r.ranks), st.n_layers, first, last, r.mb,
                                               st.recompute, layout.zero, dp, in_flight, ep=ep,
                                               experts_local=r.experts, group_mb=gmb,
                                               outputs_alive=outputs_alive(in_flight, layout.virtual, last)))
        row.append(memo[key])
    return row


def stage_costs(layout: Layout, model: ModelFacts) -> list[list[ReplicaCost]]:
    """costs[s][r]: ReplicaCost of replica r of stage s. Under ZeRO-3 each stage re-gathers its
    parameters for every micro-batch's forward and backward; prefetch overlaps the gather with
    compute, so an op takes the longer of the two (FSDP2 leaves expert parameters out)."""
    costs = [_stage_row(layout, model, s) for s in range(len(layout.stages))]
    if layout.zero == 3:
        for s, st in enumerate(layout.stages):
            dp = len(st.reps)
            nic = min(r.facts.nic_bw for r in st.reps)
            for c in {id(c): c for c in costs[s]}.values():
                g = gather_time(2 * (c.params_local - c.expert_params_local), dp, nic)
                c.fwd, c.bwd = max(c.fwd, g), max(c.bwd, g)
    return costs


def _ddp_copy_in(layout: Layout, costs: list[list[ReplicaCost]]) -> list[list[float]]:
    """Seconds of DDP's copy of each gradient into its bucket, per replica. The reducer copies from
    autograd hooks during the last micro-batch's backward (no_sync before it), before the stage's
    input gradient exists, so that backward and the send after it take the copy's time; it runs at
    the replica's own memory bandwidth. The copy back after the reduction is in sim_reduction.py."""
    return [[(costs[s][r].params_local - costs[s][r].expert_params_local) * GRAD_BYTES * 3 / rep.facts.memory_bw
             if len(st.reps) > 1 and layout.zero == 0 and len(rep.ranks) == 1 else 0.0
             for r, rep in enumerate(st.reps)] for s, st in enumerate(layout.stages)]


def fsdp_copy_seconds(layout: Layout, model: ModelFacts, costs: list[list[ReplicaCost]], s: int, r: int,
                      kind: str, j: int) -> float:
    """Seconds of FSDP2's own copies (`fsdp_copy_bytes`) in replica r of stage s's forward ("F") /
    backward ("B") of micro-batch j, at the replica's memory bandwidth."""
    c, rep, p = costs[s][r], layout.stages[s].reps[r], len(layout.stages)
    dense = (c.params_local - c.expert_params_local) * model.dtype_bytes
    ends = sum(stage_ends(s, p, layout.schedule)) * model.embed_params * model.dtype_bytes
    nbytes = fsdp_copy_bytes(dense, ends, len(layout.stages[s].reps), layout.zero, kind, j, layout.m)
    return nbytes / rep.facts.memory_bw


def op_queues(layout: Layout, model: ModelFacts, costs: list[list[ReplicaCost]]) -> list[list[list[tuple]]]:
    """queues[s][r]: replica r of stage s's operations in schedule order, each (is forward,
    micro-batch, compute seconds, DDP copy-in seconds, FSDP2 copy seconds). A backward after the
    first of a step adds its gradient accumulation. Replicas with the same cost object, chip and
    TP degree share one queue (the same numbers, computed once)."""
    stages, m, p = layout.stages, layout.m, len(layout.stages)
    sched = simulated_schedule(layout)
    ddp_in = _ddp_copy_in(layout, costs)

    def fsdp_copies(s: int, r: int, kind: str, j: int) -> float:
        return fsdp_copy_seconds(layout, model, costs, s, r, kind, j)

    memo: dict[tuple, list] = {}
    queues = []
    for s, st in enumerate(stages):
        order, row = stage_order(sched, s, p, m), []
        for r, rep in enumerate(st.reps):
            c = costs[s][r]
            key = (s, id(c), id(rep.facts), len(rep.ranks), ddp_in[s][r])
            if key not in memo:
                # FSDP2's copies depend on j only through j == 0 and j == m - 1 (fsdp_copy_bytes)
                fs = {(kind, j): fsdp_copies(s, r, kind, j) if layout.zero >= 1 else 0.0
                      for kind in "FB" for j in {0, min(1, m - 1), m - 1}}
                ops = []
                for kind, j in order:
                    d = c.fwd if kind == "F" else c.bwd + (c.grad_acc if j else 0.0)
                    ddp = ddp_in[s][r] if kind == "B" and j == m - 1 else 0.0
                    ops.append((kind == "F", j, d, ddp, fs[kind, j if j in (0, m - 1) else min(1, m - 1)]))
                memo[key] = ops
            row.append(memo[key])
        queues.append(row)
    return queues


def send_times(layout: Layout, model: ModelFacts, links: list[list[tuple[int, int, int]]]) -> tuple[list, list]:
    """(fwd_out, bwd_out): fwd_out[s][i] = [(k, seconds)] of replica i's activation sends to stage
    s+1, bwd_out[s][k] = [(i, seconds)] of replica k's gradient sends to stage s-1, in the order
    they leave (one after another on the replica's links). A send of r rows carries r x the
    boundary bytes / the sender's TP degree; each distinct send is priced once."""
    stages, p = layout.stages, len(layout.stages)
    node_of = layout.node_of or {}
    bb = model.boundary_bytes()
    memo: dict[tuple, float] = {}

    def seconds(rows: int, src: RepSpec, dst: RepSpec) -> float:
        sn = bool(node_of) and node_of.get(src.ranks[0], -1) == node_of.get(dst.ranks[0], -2)
        key = (rows, len(src.ranks), id(src.facts), id(dst.facts), sn)
        t = memo.get(key)
        if t is None:
            t = memo[key] = p2p_time(rows * bb / len(src.ranks), src.facts, dst.facts, sn)
        return t

    fwd_out = [[[] for _ in st.reps] for st in stages]
    bwd_out = [[[] for _ in st.reps] for st in stages]
    for s in range(p - 1):
        for i, k, rows in links[s]:
            fwd_out[s][i].append((k, rows))
            bwd_out[s + 1][k].append((i, rows))
    fwd_out = [[[(k, seconds(rows, st.reps[i], stages[s + 1].reps[k])) for k, rows in fwd_out[s][i]]
                for i in range(len(st.reps))] for s, st in enumerate(stages)]
    bwd_out = [[[(i, seconds(rows, st.reps[k], stages[s - 1].reps[i])) for i, rows in bwd_out[s][k]]
                for k in range(len(st.reps))] for s, st in enumerate(stages)]
    return fwd_out, bwd_out
