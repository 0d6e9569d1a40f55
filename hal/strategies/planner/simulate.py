"""Event-driven simulation of one training step of a layout (a Plan with each replica's figures).

Each replica (a TP group) is one resource executing its pipeline schedule's operations in order
(1F1B: warm-up forwards, then one forward one backward, then cool-down backwards; GPipe: all
forwards then all backwards). An operation starts when its replica is free and its inputs have
arrived: a forward needs the rows of the micro-batch it owns from every replica of the previous
stage that owns some of them (re-slicing between stages of different DP degree), a backward needs
the gradients of those rows from the next stage. A replica's sends leave one after another on its
NICs (link sharing). After its last backward a replica's DP gradient reduction runs, overlapping
that backward except for the last bucket, then the optimizer step. Start times are a longest path
through this graph, computed in one topological pass.

Interleaved and zero-bubble schedules are simulated as 1F1B (a conservative bound: they only
shrink the bubble); the report says so.
"""
from __future__ import annotations

import copy
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .cost import GRAD_BYTES, ModelFacts, ReplicaCost, dp_reduce_time, gather_time, p2p_time, replica_cost
from .facts import ChipFacts

DDP_BUCKET_BYTES = 2**20   # apply_plan's DDP bucket cap (hal.strategies.apply._apply_dp: bucket_cap_mb=1.0)


@dataclass
class RepSpec:
    facts: ChipFacts
    ranks: tuple[int, ...]
    mb: int
    experts: Optional[int] = None     # experts hosted (MoE)


@dataclass
class StageSpec:
    layers: tuple[int, int]
    reps: list[RepSpec]
    recompute: bool = False
    ep: Optional[int] = None          # MoE: replicas per EP group (None: one EP group of all replicas)

    @property
    def n_layers(self) -> int:
        return self.layers[1] - self.layers[0]

    @property
    def microbatch(self) -> int:
        return sum(r.mb for r in self.reps)


# hal/strategies/pipeline_parallel.HeteroPipeline sends each input gradient from a hook on the stage input,
# the moment autograd computes it, so the last micro-batch's sends do not wait for the DP reduction
# that DDP / FSDP2 run inside that backward. Both the simulator and the search's closed form read this.
SEND_AFTER_REDUCTION = False


def fsdp_copy_bytes(dense: float, ends: float, d: int, zero: int, kind: str, j: int, m: int) -> float:
    """Bytes of FSDP2's own copies (apply_plan's zero >= 1: fully_shard per block and the stage)
    in micro-batch j's forward (kind "F") / backward ("B") of a replica, P = `dense`, its dense
    parameter bytes (`ends`: those of the embedding / head, never resharded), d = the DP degree.
    HeteroPipeline keeps the parameters gathered between micro-batches
    (set_reshard_after_backward(last)), so the first forward gathers them: all_gather_copy_in
    ((2 + 2/d) P counted: shards read, buffer written) and split_with_sizes_copy out of the buffer
    (2P); ZeRO-3 reshards after each forward, so every backward gathers the blocks again (the root
    stays gathered); the last backward packs the gradients for the reduce-scatter (chunk_cat, 2P)
    before the stage's input gradient exists. Counted op by op with hal.emulation.timed.record_ops on FSDP2
    stages of dp 2 (torch 2.13) and checked against a timed-emulated PP2 x DP2 ZeRO-2 step's
    timeline (benchmarks/planner_prediction.py); tests/test_planner_runtime_copies.py counts them
    on the real wrappers. The reduced shard's copy into .grad (3P/d) runs after backward: reduction()."""
    if kind == "F":
        return (4 + 2 / d) * dense if j == 0 else 0.0
    regather = (4 + 2 / d) * max(dense - ends, 0.0) if zero == 3 else 0.0
    return regather + (2 * dense if j == m - 1 else 0.0)


@dataclass
class Layout:
    """What the simulator needs of a plan: stages, replicas with their chip figures, micro-batches."""

    stages: list[StageSpec]
    m: int                       # micro-batches per step
    zero: int = 0
    schedule: str = "1F1B"
    node_of: Optional[dict[int, int]] = None   # rank -> node (None: every TP group on one node)
    # True: a runtime that sends a stage's input gradients of the last micro-batch only when
    # backward() returns, i.e. after the DDP / FSDP2 gradient reduction that runs inside that backward
    # (apply_plan's pipeline did until it sent from a hook on the input, as Megatron-LM sends first;
    # measured on timed-emulated runs: benchmarks/planner_prediction.py, docs/planner.md)
    send_after_reduction: bool = SEND_AFTER_REDUCTION

    @property
    def global_batch(self) -> int:
        return self.stages[0].microbatch * self.m


@dataclass
class RankStats:
    rank: int
    chip: str
    sub_cluster: str
    stage: int
    busy_s: float
    comm_s: float
    bubble_s: float
    idle_s: float
    memory_bytes: float
    capacity_bytes: float
    flops: float                 # model FLOPs this rank performed in the step


@dataclass
class SimResult:
    step_time_s: float
    tokens_per_s: float
    ranks: list[RankStats]
    mfu: dict[str, float]                  # per chip kind (sub-cluster name)
    bubble_share: float
    comm_share: float
    fits: bool
    notes: list[str] = field(default_factory=list)
    trace: list[dict] = field(default_factory=list)

    def write_trace(self, path: str | Path) -> None:
        """Chrome trace / Perfetto JSON (open in chrome://tracing or ui.perfetto.dev)."""
        Path(path).write_text(json.dumps({"traceEvents": self.trace, "displayTimeUnit": "ms"}))


def _schedule(kind: str, p: int, s: int, m: int) -> list[tuple[str, int]]:
    if kind == "GPipe":
        return [("F", j) for j in range(m)] + [("B", j) for j in range(m)]
    warm = min(p - s - 1, m)
    ops = [("F", j) for j in range(warm)]
    f, b = warm, 0
    while b < m:
        if f < m:
            ops.append(("F", f))
            f += 1
        ops.append(("B", b))
        b += 1
    return ops


def _ranges(stage: StageSpec) -> list[tuple[int, int]]:
    out, o = [], 0
    for r in stage.reps:
        out.append((o, o + r.mb))
        o += r.mb
    return out


def simulate(layout: Layout, model: ModelFacts, trace: bool = False) -> SimResult:
    stages, m, p = layout.stages, layout.m, len(layout.stages)
    node_of = layout.node_of or {}
    notes = []
    if layout.schedule not in ("1F1B", "GPipe"):
        notes.append(f"schedule {layout.schedule} simulated as 1F1B (an upper bound on its bubble)")
    sched_kind = "GPipe" if layout.schedule == "GPipe" else "1F1B"

    def same_node(a: RepSpec, b: RepSpec) -> bool:
        return bool(node_of) and node_of.get(a.ranks[0], -1) == node_of.get(b.ranks[0], -2)

    # ---- per replica costs
    costs: list[list[ReplicaCost]] = []
    for s, st in enumerate(stages):
        row, memo = [], {}
        dp = len(st.reps)
        nic = min(x.facts.nic_bw for x in st.reps)
        smb = st.microbatch                # invariant over the stage's replicas: summed once
        in_flight = m if sched_kind == "GPipe" else min(m, p - s)
        grp_memo: dict[int, tuple] = {}    # EP group index -> (its rows, whether its ranks share a node)
        for j, r in enumerate(st.reps):
            tp = len(r.ranks)
            # EP bandwidth per rank: each TP rank moves all its replica's tokens (cost._replica_cost)
            ep, gmb = ((dp, nic) if model.experts and dp > 1 else None), smb
            if model.experts and st.ep is not None:
                # EP group of st.ep consecutive replicas: its all_to_all on the intra link when its
                # ranks share a node, else the NIC; its experts see the group's rows
                gi = j // st.ep
                if gi not in grp_memo:
                    grp = st.reps[gi * st.ep:(gi + 1) * st.ep]
                    grp_memo[gi] = (sum(x.mb for x in grp),
                                    bool(node_of) and len({node_of.get(x) for g in grp for x in g.ranks}) == 1)
                gmb, one = grp_memo[gi]
                ep = (st.ep, r.facts.intra_bw if one else r.facts.nic_bw) if st.ep > 1 else None
            key = (r.facts.name, tp, r.mb, r.experts, ep, gmb)
            if key not in memo:   # replicas of one kind and share cost the same: compute once
                memo[key] = copy.copy(replica_cost(model, r.facts, tp, st.n_layers, s == 0, s == p - 1, r.mb, st.recompute,
                                         layout.zero, dp, in_flight, ep=ep, experts_local=r.experts,
                                         group_mb=gmb))
            row.append(memo[key])
        costs.append(row)
    # ZeRO-3 re-gathers each stage's parameters for every micro-batch's forward and backward;
    # prefetch overlaps it with compute, so an op takes the longer of the two.
    if layout.zero == 3:
        for s, st in enumerate(stages):
            dp = len(st.reps)
            nic = min(r.facts.nic_bw for r in st.reps)
            for c in {id(c): c for c in costs[s]}.values():
                # FSDP2 leaves expert parameters out (apply._apply_dp): only the dense ones are gathered
                g = gather_time(2 * (c.params_local - c.expert_params_local), dp, nic)
                c.fwd, c.bwd = max(c.fwd, g), max(c.bwd, g)

    # ---- row overlaps between consecutive stages: (r, r2, rows)
    ranges = [_ranges(st) for st in stages]
    links: list[list[tuple[int, int, int]]] = []
    for s in range(p - 1):
        # both stages' ranges tile the micro-batch in order, so the replicas of stage s+1 a replica of
        # stage s overlaps are consecutive and move forward with it: one merge pass (was every pair,
        # quadratic in the DP degree), the same (i, k, rows) in the same order
        lst, nxt_r, kp = [], ranges[s + 1], 0
        for i, (a0, a1) in enumerate(ranges[s]):
            while kp < len(nxt_r) and nxt_r[kp][1] <= a0:
                kp += 1
            k = kp
            while k < len(nxt_r) and nxt_r[k][0] < a1:
                b0, b1 = nxt_r[k]
                rows = min(a1, b1) - max(a0, b0)
                if rows > 0:
                    lst.append((i, k, rows))
                k += 1
        links.append(lst)
    sends_fwd = [defaultdict(list) for _ in range(p)]   # stage s, rep i -> [(k, rows)] to stage s+1
    sends_bwd = [defaultdict(list) for _ in range(p)]   # stage s+1, rep k -> [(i, rows)] to stage s
    for s in range(p - 1):
        for i, k, rows in links[s]:
            sends_fwd[s][i].append((k, rows))
            sends_bwd[s + 1][k].append((i, rows))

    # ---- DP gradient reduction of stage s, given its replicas' last backward (latest start, end):
    # (when it ends, whether it runs inside that backward: DDP's and FSDP2's reductions run in
    # autograd's hooks and final callback, so the input gradients the stage sends upstream leave
    # only when backward() returns, after the reduction; apply_plan's TP stages reduce after the
    # pipeline instead)
    def reduction(s: int, last_b_start: float, last_b_end: float) -> tuple[float, bool]:
        st = stages[s]
        dp = len(st.reps)
        params = 0.0
        t_red = 0.0
        if dp > 1:
            params = costs[s][0].params_local
            eparams = 0.0
            if model.experts:   # expert weights live once in the EP group: not DP-reduced
                eparams = costs[s][0].expert_params_local     # whole on each TP rank (cost.py)
                params -= eparams
            parts: dict[str, list] = {}
            for r in st.reps:
                parts.setdefault(r.facts.name, [r.facts, 0, None])[1] += 1
            plist = []
            for f, n, _ in parts.values():
                members = [x.ranks[0] for x in st.reps if x.facts.name == f.name]
                one_node = bool(node_of) and len({node_of.get(x) for x in members}) == 1
                plist.append((f, n, f.intra_bw if one_node else f.nic_bw))
            t_red = dp_reduce_time(max(params, 0) * GRAD_BYTES, plist)
            if st.ep is not None and dp // st.ep > 1 and eparams:
                # expert data parallel: the dp / ep copies of each expert (one per EP group, on other
                # nodes) SUM-reduce their gradients after the dense ones, on the NIC / the bridge
                eparts: dict[str, list] = {}
                for r in st.reps[::st.ep]:
                    eparts.setdefault(r.facts.name, [r.facts, 0, r.facts.nic_bw])[1] += 1
                t_red += dp_reduce_time(eparams * GRAD_BYTES, [tuple(v) for v in eparts.values()])
        if dp > 1 and layout.zero == 0 and len(st.reps[0].ranks) == 1:
            # apply_plan's DDP: the reduction starts bucket by bucket during the last backward, so
            # the last bucket (1 / buckets of it, at most 1 / layers) is exposed; the reducer copies
            # each gradient into its bucket inside that backward (ddp_copy_in, already in its
            # duration) and back after the reduction (a copy_: dst + src read, dst written)
            nb = max(1, min(st.n_layers, math.ceil(max(params, 0) * GRAD_BYTES / DDP_BUCKET_BYTES)))
            copy_back = max(params, 0) * GRAD_BYTES * 3 / min(x.facts.memory_bw for x in st.reps)
            red_end = max(last_b_start + t_red, last_b_end + t_red / nb) + copy_back
        elif dp > 1 and layout.zero == 0:
            # TP stages: one flat all_reduce after the pipeline (apply_plan's _sum_grads: cat, reduce,
            # copy back), not overlapped
            copies = max(params, 0) * GRAD_BYTES * 5 / min(x.facts.memory_bw for x in st.reps)
            red_end = last_b_end + t_red + copies
        elif dp > 1:   # FSDP2: reduce-scatter per layer during backward, the last layer's exposed,
            # then each reduced shard copied into .grad (a copy_ of P / dp: dst + src read, dst written)
            copy_out = 3 * max(params, 0) * model.dtype_bytes / dp / min(x.facts.memory_bw for x in st.reps)
            red_end = max(last_b_start + t_red, last_b_end + t_red / max(st.n_layers, 1)) + copy_out
        else:
            red_end = last_b_end
        return red_end, dp > 1 and not (layout.zero == 0 and len(st.reps[0].ranks) > 1)

    # ---- longest path through (replica order + data dependencies)
    # Per-(stage, replica, micro-batch) state lives in lists indexed [s][r][j] (a replica's ops are the
    # same for every replica of a stage: its schedule). Everything an op adds to its start time is
    # computed once per distinct cost (replicas of one kind and share share their ReplicaCost object)
    # and every send's time once per distinct (rows, ranks, src, dst, same node): the same numbers
    # the per-op formulas give, added in the same order, so the step's figures are unchanged.
    nreps = [len(st.reps) for st in stages]
    need_f = [[0] * n for n in nreps]   # inputs a forward of (s, r) waits for (every micro-batch alike)
    need_b = [[0] * n for n in nreps]
    for s in range(p - 1):
        for i, k, rows in links[s]:
            need_f[s + 1][k] += 1
            need_b[s][i] += 1
    # DDP's reducer copies each gradient into its bucket from autograd hooks during the last
    # micro-batch's backward (no_sync before it), before the stage's input gradient exists: that
    # backward, and the input-gradient send after it, take the copy's time (measured on timed-emulated
    # runs: benchmarks/planner_prediction.py; the copy back after the reduction is in reduction())
    ddp_copy_in = [[(costs[s][r].params_local - costs[s][r].expert_params_local) * GRAD_BYTES * 3 / rep.facts.memory_bw
                    if len(st.reps) > 1 and layout.zero == 0 and len(rep.ranks) == 1 else 0.0
                    for r, rep in enumerate(st.reps)] for s, st in enumerate(stages)]

    def fsdp_copies(s: int, r: int, kind: str, j: int) -> float:
        c, rep = costs[s][r], stages[s].reps[r]
        dense = (c.params_local - c.expert_params_local) * model.dtype_bytes
        ends = ((s == 0) + (s == p - 1)) * model.embed_params * model.dtype_bytes
        return fsdp_copy_bytes(dense, ends, len(stages[s].reps), layout.zero, kind, j, m) / rep.facts.memory_bw

    # each op of a replica's queue: (kind, j, duration, DDP copy-in, FSDP copies), t1 = t0 + ... in order
    scheds = [_schedule(sched_kind, p, s, m) for s in range(p)]
    op_memo: dict[tuple, list] = {}
    plans: list[list[list]] = []
    for s, st in enumerate(stages):
        row = []
        for r, rep in enumerate(st.reps):
            c = costs[s][r]
            key = (s, id(c), id(rep.facts), len(rep.ranks), ddp_copy_in[s][r])
            if key not in op_memo:
                ops = []
                for kind, j in scheds[s]:
                    d = c.fwd if kind == "F" else c.bwd + (c.grad_acc if j else 0.0)
                    ddp = ddp_copy_in[s][r] if kind == "B" and j == m - 1 else 0.0
                    fs = fsdp_copies(s, r, kind, j) if layout.zero >= 1 else 0.0
                    ops.append((kind == "F", j, d, ddp, fs))
                op_memo[key] = ops
            row.append(op_memo[key])
        plans.append(row)
    bb = model.boundary_bytes()
    p2p_memo: dict[tuple, float] = {}

    def send_time(rows: int, src: RepSpec, dst: RepSpec) -> float:
        sn = same_node(src, dst)
        key = (rows, len(src.ranks), id(src.facts), id(dst.facts), sn)
        t = p2p_memo.get(key)
        if t is None:
            t = p2p_memo[key] = p2p_time(rows * bb / len(src.ranks), src.facts, dst.facts, sn)
        return t

    # sends of (s, r): forward to stage s+1 [(k, seconds)], backward to stage s-1 [(i, seconds)]
    fwd_out = [[[(k, send_time(rows, st.reps[i], stages[s + 1].reps[k])) for k, rows in sends_fwd[s][i]]
                if s < p - 1 else [] for i in range(len(st.reps))] for s, st in enumerate(stages)]
    bwd_out = [[[(i, send_time(rows, st.reps[k], stages[s - 1].reps[i])) for i, rows in sends_bwd[s][k]]
                if s > 0 else [] for k in range(len(st.reps))] for s, st in enumerate(stages)]

    arr_f = [[[0.0] * m for _ in range(n)] for n in nreps]    # arrival of the last input, per op
    arr_b = [[[0.0] * m for _ in range(n)] for n in nreps]
    got_f = [[[0] * m for _ in range(n)] for n in nreps]
    got_b = [[[0] * m for _ in range(n)] for n in nreps]
    done_f = [[[None] * m for _ in range(n)] for n in nreps]
    done_b = [[[None] * m for _ in range(n)] for n in nreps]
    start_f = [[[0.0] * m for _ in range(n)] for n in nreps]
    start_b = [[[0.0] * m for _ in range(n)] for n in nreps]
    pos = [[0] * n for n in nreps]
    free = [[0.0] * n for n in nreps]
    last_b: dict[int, list] = defaultdict(list)   # stage -> (replica, start, end) of its last backward
    red_at: dict[int, float] = {}                 # stage -> end of its DP reduction, once known
    events = []
    total_ops = sum(len(scheds[s]) * nreps[s] for s in range(p))
    finished = 0
    # worklist of replicas that may be able to run their next op
    work = [(s, r) for s in range(p) for r in range(nreps[s])]
    while work:
        nxt = []
        progressed = False
        for s, r in work:
            ops = plans[s][r]
            nops = len(ops)
            pr = pos[s][r]
            fr = free[s][r]
            while pr < nops:
                is_f, j, d, ddp, fs = ops[pr]
                if is_f:
                    if got_f[s][r][j] < need_f[s][r]:
                        break
                    t0 = fr if fr >= arr_f[s][r][j] else arr_f[s][r][j]
                else:
                    if got_b[s][r][j] < need_b[s][r] or done_f[s][r][j] is None:
                        break
                    t0 = fr if fr >= arr_b[s][r][j] else arr_b[s][r][j]
                t1 = t0 + d
                if ddp:
                    t1 += ddp
                if fs:
                    t1 += fs
                if is_f:
                    done_f[s][r][j], start_f[s][r][j] = t1, t0
                else:
                    done_b[s][r][j], start_b[s][r][j] = t1, t0
                fr = t1
                pr += 1
                finished += 1
                progressed = True
                if trace:
                    rep = stages[s].reps[r]
                    events.append({"name": f"{'F' if is_f else 'B'}{j}", "ph": "X", "ts": t0 * 1e6,
                                   "dur": (t1 - t0) * 1e6, "pid": s, "tid": r,
                                   "args": {"ranks": list(rep.ranks), "chip": rep.facts.name,
                                            "microbatch_rows": rep.mb}})
                # sends, one after another on this replica's links
                t_send = t1
                if is_f:
                    if s < p - 1:
                        af, gf = arr_f[s + 1], got_f[s + 1]
                        for k, dt in fwd_out[s][r]:
                            t_send += dt
                            if t_send > af[k][j]:
                                af[k][j] = t_send
                            gf[k][j] += 1
                            nxt.append((s + 1, k))
                elif s > 0:
                    if j == m - 1 and nreps[s] > 1 and layout.send_after_reduction:
                        # the last backward returns after the stage's DP reduction when that runs
                        # inside backward: every replica's input gradients wait for it
                        last_b[s].append((r, t0, t1))
                        if len(last_b[s]) < nreps[s]:
                            continue
                        red_at[s], inside = reduction(s, max(x[1] for x in last_b[s]), max(x[2] for x in last_b[s]))
                        leave = [(rr, red_at[s] if inside else t_end) for rr, _, t_end in last_b[s]]
                    else:
                        leave = [(r, t1)]
                    ab, gb = arr_b[s - 1], got_b[s - 1]
                    for rr, t_send in leave:
                        for i, dt in bwd_out[s][rr]:
                            t_send += dt
                            if t_send > ab[i][j]:
                                ab[i][j] = t_send
                            gb[i][j] += 1
                            nxt.append((s - 1, i))
            pos[s][r] = pr
            free[s][r] = fr
        work = list(dict.fromkeys(nxt))
        if not progressed and finished < total_ops and not work:
            break
    if finished < total_ops:
        raise RuntimeError(f"simulation deadlocked after {finished} of {total_ops} operations "
                           "(a schedule whose dependencies cannot be met)")

    # ---- DP gradient reduction (overlapping the last backward but its last bucket) + optimizer
    ranks: list[RankStats] = []
    step_end = 0.0
    per_rep_end = []
    red_ends: list[float] = []
    for s, st in enumerate(stages):
        dp = len(st.reps)
        last_b_start = max(start_b[s][r][m - 1] for r in range(dp))
        last_b_end = max(done_b[s][r][m - 1] for r in range(dp))
        red_end = red_at[s] if s in red_at else reduction(s, last_b_start, last_b_end)[0]
        red_ends.append(red_end)
        if trace and dp > 1:
            for r in range(dp):
                events.append({"name": "dp_reduce", "ph": "X", "ts": max(last_b_start, 0) * 1e6,
                               "dur": (red_end - last_b_start) * 1e6, "pid": s, "tid": r, "cat": "comm"})
    # the step's loss is all-reduced over the world before the optimizer (apply_plan's step): every
    # rank waits there for the slowest reduction
    world_parts: dict[str, list] = {}
    for st in stages:
        for rep in st.reps:
            world_parts.setdefault(rep.facts.name, [rep.facts, 0, rep.facts.nic_bw])[1] += len(rep.ranks)
    t_barrier = max(red_ends) + dp_reduce_time(4.0, [tuple(v) for v in world_parts.values()])
    for s, st in enumerate(stages):
        row = []
        for r, rep in enumerate(st.reps):
            end = t_barrier + costs[s][r].optimizer
            row.append((end, red_ends[s] - done_b[s][r][m - 1]))
            step_end = max(step_end, end)
        per_rep_end.append(row)

    tokens = layout.global_batch * model.seq
    flops_total = 0.0
    mfu_num: dict[str, float] = defaultdict(float)
    mfu_den: dict[str, float] = defaultdict(float)
    busy_all = comm_all = bubble_all = 0.0
    fits = True
    for s, st in enumerate(stages):
        fl_model = (model.layer_fwd_flops() * st.n_layers + (model.head_fwd_flops() if s == p - 1 else 0)) * 3
        for r, rep in enumerate(st.reps):
            c = costs[s][r]
            tp = len(rep.ranks)
            busy = m * (c.fwd + c.bwd) + (m - 1) * c.grad_acc
            inner_comm = m * (c.tp_comm + c.ep_comm)
            end, exposed = per_rep_end[s][r]
            first_start = start_f[s][r][0]
            last_end = done_b[s][r][m - 1]
            bubble = max(0.0, (last_end - first_start) - busy) + first_start
            idle = max(0.0, step_end - end)
            fl_rank = fl_model * rep.mb * m / tp
            for rank in rep.ranks:
                ranks.append(RankStats(rank=rank, chip=rep.facts.chip, sub_cluster=rep.facts.name, stage=s,
                                       busy_s=busy - inner_comm, comm_s=inner_comm + exposed,
                                       bubble_s=bubble, idle_s=idle, memory_bytes=c.memory,
                                       capacity_bytes=rep.facts.memory, flops=fl_rank))
                mfu_num[rep.facts.name] += fl_rank
                mfu_den[rep.facts.name] += step_end * rep.facts.peak
                flops_total += fl_rank
                busy_all += busy - inner_comm
                comm_all += inner_comm + exposed
                bubble_all += bubble
                if c.memory > rep.facts.memory:
                    fits = False
    n = max(len(ranks), 1)
    res = SimResult(step_time_s=step_end, tokens_per_s=tokens / step_end if step_end > 0 else 0.0,
                    ranks=sorted(ranks, key=lambda x: x.rank),
                    mfu={k: mfu_num[k] / mfu_den[k] for k in mfu_num},
                    bubble_share=bubble_all / (n * step_end) if step_end else 0.0,
                    comm_share=comm_all / (n * step_end) if step_end else 0.0,
                    fits=fits, notes=notes, trace=events)
    return res
