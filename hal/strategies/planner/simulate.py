"""Event-driven simulation of one training step of a layout (a Plan with each replica's figures).

Each replica (a TP group) is one resource executing its pipeline schedule's operations in order
(hal/strategies/schedule.py: the order the runtime runs). An operation starts when its replica is
free and its inputs have arrived: a forward needs the rows of the micro-batch it owns from every
replica of the previous stage that owns some of them (re-slicing between stages of different DP
degree), a backward needs the gradients of those rows from the next stage. A replica's sends leave
one after another on its links (link sharing). After its last backward a replica's DP gradient
reduction runs, overlapping that backward except for the last bucket, then the loss all-reduce and
the optimizer step. Start times are a longest path through this graph, computed in one pass.

The stages of `simulate`, one module each:
  sim_costs.py      per-op costs: each replica's forward / backward / copies, each send's seconds
  layout.py         the layout and the rows each replica sends the next stage (`row_links`)
  sim_events.py     the longest-path pass over every replica's schedule (1F1B, GPipe)
  sim_chain.py      the same for ZBVZeroBubble (torch's F / I / W order, two stages per rank group in a V)
                    and Interleaved1F1B (F / B, v stages per rank group round-robin)
  sim_reduction.py  the DP / ZeRO reduction and the loss all-reduce
  this module       the step's end, per-rank statistics and the result

ZBVZeroBubble and Interleaved1F1B replay torch's own action order (sim_chain.py). An interleaved layout
the replay cannot take (unequal chains) is the 1F1B pass less (1 - 1/v) of its fill and drain
(`_interleaved`); other multi-stage schedules are simulated as 1F1B (a conservative bound: they only
shrink the bubble); the result's notes say so.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from ..schedule import ORDERED_SCHEDULES, Schedule
from .cost import ModelFacts, ReplicaCost
from .layout import SEND_AFTER_REDUCTION, Layout, RepSpec, StageSpec, row_links, stage_ends
from .sim_chain import ChainPass
from .sim_costs import _ddp_copy_in, fsdp_copy_bytes, fsdp_copy_seconds, op_queues, send_times, stage_costs
from .sim_events import EventPass
from .sim_reduction import DDP_BUCKET_BYTES, loss_allreduce_seconds, reduction_end

# the names other modules and tests import from here
__all__ = ["simulate", "Layout", "StageSpec", "RepSpec", "SimResult", "RankStats", "SEND_AFTER_REDUCTION",
           "fsdp_copy_bytes", "DDP_BUCKET_BYTES"]


@dataclass
class RankStats:
    """One rank's share of the simulated step (seconds) and its memory against its capacity."""

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
    """The simulated step: its time and throughput, per-rank figures, MFU per sub-cluster."""

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


def simulate(layout: Layout, model: ModelFacts, trace: bool = False) -> SimResult:
    """One step of `layout`: per-op costs, the event pass over the schedule, each stage's DP
    reduction, the loss all-reduce and the optimizer, then the statistics. With `trace` the result
    carries a Chrome trace (one process per stage, one thread per replica)."""
    notes = []
    zbv = layout.schedule == Schedule.ZBV_ZERO_BUBBLE
    if layout.schedule not in ORDERED_SCHEDULES and layout.virtual <= 1:
        notes.append(f"schedule {layout.schedule} simulated as 1F1B (an upper bound on its bubble)")
    costs = stage_costs(layout, model)

    def reduction(s: int, last_b_start: float, last_b_end: float) -> tuple[float, bool]:
        return reduction_end(layout, model, costs, s, last_b_start, last_b_end)

    if zbv and layout.virtual == 2:
        ev = ChainPass(layout, model, costs, _ddp_copy_in(layout, costs),
                       lambda s, r, kind, j: fsdp_copy_seconds(layout, model, costs, s, r, kind, j), trace).run()
        notes.append("ZBVZeroBubble: torch's F / I / W order replayed, W = the weight-gradient GEMMs "
                     "(Qi et al. 2023)")
        step_end, per_rep_end = _step_end(layout, costs, ev, reduction, trace)
        return _statistics(layout, model, costs, ev, step_end, per_rep_end, notes)
    if layout.virtual > 1 and not zbv:
        try:
            ev = ChainPass(layout, model, costs, _ddp_copy_in(layout, costs),
                           lambda s, r, kind, j: fsdp_copy_seconds(layout, model, costs, s, r, kind, j), trace,
                           interleaved=True).run()
        except ValueError as e:          # unequal chains, or an M torch's order refuses: the closed form
            notes.append(f"Interleaved1F1B not replayed ({e}): the closed form below")
        else:
            notes.append(f"Interleaved1F1B: torch's order replayed, {layout.virtual} stages per rank group")
            step_end, per_rep_end = _step_end(layout, costs, ev, reduction, trace)
            return _statistics(layout, model, costs, ev, step_end, per_rep_end, notes)
    fwd_out, bwd_out = send_times(layout, model, row_links(layout.stages))
    ev = EventPass(layout.stages, layout.m, op_queues(layout, model, costs), fwd_out, bwd_out, reduction,
                   layout.send_after_reduction, trace).run()
    step_end, per_rep_end = _step_end(layout, costs, ev, reduction, trace)
    if layout.virtual > 1:
        step_end = _interleaved(layout, costs, fwd_out, step_end, notes)
    return _statistics(layout, model, costs, ev, step_end, per_rep_end, notes)


def _interleaved(layout: Layout, costs: list[list[ReplicaCost]], fwd_out: list, step_end: float,
                 notes: list[str]) -> float:
    """The step of torch's Interleaved1F1B with v stages per rank group: the 1F1B event pass less
    (1 - 1/v) of its pipeline fill and drain (the slowest replica's forward + backward of every stage
    but the slowest: Narayanan et al. 2021, the bubble shrinks v-fold), plus (v - 1) x each boundary's
    slowest sends forward and back (a micro-batch crosses p v - 1 boundaries instead of p - 1)."""
    v = layout.virtual
    per_stage = [max(c.fwd + c.bwd for c in row) for row in costs]
    gain = (1 - 1 / v) * (sum(per_stage) - max(per_stage))
    sends = sum(max((sum(t for _, t in out) for out in fwd_out[s]), default=0.0) for s in range(len(costs) - 1))
    notes.append(f"Interleaved1F1B with {v} stages per rank group: the 1F1B simulation less (1 - 1/{v}) of its "
                 f"fill and drain ({gain:.3g} s), plus {v - 1} x the sends ({2 * (v - 1) * sends:.3g} s)")
    return step_end - gain + 2 * (v - 1) * sends


def _step_end(layout: Layout, costs: list[list[ReplicaCost]], ev: "EventPass | ChainPass", reduction,
              trace: bool) -> tuple[float, list[list[tuple[float, float]]]]:
    """(end of the step, per replica (its optimizer's end, seconds of its stage's reduction after
    its last backward)). Each stage's DP reduction follows its replicas' last backward (unless the
    event pass placed it already); the loss all-reduce waits for the slowest stage; then each
    replica's optimizer step."""
    m = layout.m
    red_ends: list[float] = []
    for s, st in enumerate(layout.stages):
        dp = len(st.reps)
        last_b_start = max(ev.start_b[s][r][m - 1] for r in range(dp))
        last_b_end = max(ev.done_b[s][r][m - 1] for r in range(dp))
        red_end = ev.red_at[s] if s in ev.red_at else reduction(s, last_b_start, last_b_end)[0]
        red_ends.append(red_end)
        if trace and dp > 1:
            for r in range(dp):
                ev.events.append({"name": "dp_reduce", "ph": "X", "ts": max(last_b_start, 0) * 1e6,
                                  "dur": (red_end - last_b_start) * 1e6, "pid": s, "tid": r, "cat": "comm"})
    t_barrier = max(red_ends) + loss_allreduce_seconds(layout)
    step_end = 0.0
    per_rep_end = []
    for s, st in enumerate(layout.stages):
        row = []
        for r in range(len(st.reps)):
            end = t_barrier + costs[s][r].optimizer
            row.append((end, red_ends[s] - ev.done_b[s][r][m - 1]))
            step_end = max(step_end, end)
        per_rep_end.append(row)
    return step_end, per_rep_end


def _statistics(layout: Layout, model: ModelFacts, costs: list[list[ReplicaCost]], ev: "EventPass | ChainPass",
                step_end: float, per_rep_end: list, notes: list[str]) -> SimResult:
    """Per rank: busy (compute, less TP / EP communication), comm (that communication plus its
    stage's exposed reduction), bubble (waiting inside its first-forward..last-backward span, and
    before it), idle (after its optimizer, until the step ends), memory, model FLOPs; and over the
    step: MFU per sub-cluster, bubble and communication shares, whether every rank fits."""
    m, p = layout.m, len(layout.stages)
    ranks: list[RankStats] = []
    mfu_num: dict[str, float] = defaultdict(float)
    mfu_den: dict[str, float] = defaultdict(float)
    comm_all = bubble_all = 0.0
    fits = True
    for s, st in enumerate(layout.stages):
        head = stage_ends(s, p, layout.schedule)[1]
        fl_model = (model.layer_fwd_flops() * st.n_layers + (model.head_fwd_flops() if head else 0)) * 3
        for r, rep in enumerate(st.reps):
            c = costs[s][r]
            busy = m * (c.fwd + c.bwd) + (m - 1) * c.grad_acc
            inner_comm = m * (c.tp_comm + c.ep_comm)
            end, exposed = per_rep_end[s][r]
            first_start = ev.start_f[s][r][0]
            bubble = max(0.0, (ev.done_b[s][r][m - 1] - first_start) - busy) + first_start
            idle = max(0.0, step_end - end)
            fl_rank = fl_model * rep.mb * m / len(rep.ranks)
            for rank in rep.ranks:
                ranks.append(RankStats(rank=rank, chip=rep.facts.chip, sub_cluster=rep.facts.name, stage=s,
                                       busy_s=busy - inner_comm, comm_s=inner_comm + exposed,
                                       bubble_s=bubble, idle_s=idle, memory_bytes=c.memory,
                                       capacity_bytes=rep.facts.memory, flops=fl_rank))
                mfu_num[rep.facts.name] += fl_rank
                mfu_den[rep.facts.name] += step_end * rep.facts.peak
                comm_all += inner_comm + exposed
                bubble_all += bubble
                if c.memory > rep.facts.memory:
                    fits = False
    n = max(len(ranks), 1)
    tokens = layout.global_batch * model.seq
    return SimResult(step_time_s=step_end, tokens_per_s=tokens / step_end if step_end > 0 else 0.0,
                     ranks=sorted(ranks, key=lambda x: x.rank),
                     mfu={k: mfu_num[k] / mfu_den[k] for k in mfu_num},
                     bubble_share=bubble_all / (n * step_end) if step_end else 0.0,
                     comm_share=comm_all / (n * step_end) if step_end else 0.0,
                     fits=fits, notes=notes, trace=ev.events)
