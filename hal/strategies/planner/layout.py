"""What the step simulator needs of a plan: stages of replicas, each replica with its chip's figures
(`Layout`), and where the rows of a micro-batch go between consecutive stages (`row_links`).

A `Plan` (hal/strategies/plan.py) names ranks; a `Layout` adds each replica's `ChipFacts`, which is
what the cost model prices. convert.py turns one into the other.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Sequence, Union

from ..schedule import Schedule, interleaved_rank_order, interleaved_warmup
from .facts import ChipFacts

# hal/strategies/pipeline_parallel.HeteroPipeline sends each input gradient from a hook on the stage
# input, the moment autograd computes it, so the last micro-batch's sends do not wait for the DP
# reduction that DDP / FSDP2 run inside that backward. Both the simulator and the search's closed
# form read this.
SEND_AFTER_REDUCTION = False


def in_flight(m: int, p: int, s: int, virtual: int = 1, schedule: Union[Schedule, str, None] = None,
              chunks: Optional[Sequence[int]] = None, per_round: Optional[int] = None) -> float:
    """Micro-batches of stage s's activations alive at its peak, in micro-batches of its whole stage:
    1F1B min(m, p - s); interleaved with v stages per rank group (torch's Interleaved1F1B) counted on
    torch's own order (`interleaved_in_flight`; `chunks`: the group's layers per chunk, `per_round`: another
    N of contiguous micro-batches than torch's, Llama 3's tunable N); ZBVZeroBubble
    counted on torch's own order (`zbv_in_flight`: p on every rank group for m >= 2p - 1, the same
    peak as 1F1B's first stage, as Qi et al. 2023, section 6, state)."""
    if schedule == Schedule.ZBV_ZERO_BUBBLE:
        return zbv_in_flight(m, p, s)
    if virtual <= 1:
        return min(m, p - s)
    return interleaved_in_flight(m, p, s, virtual, tuple(chunks) if chunks is not None else None, per_round)


def outputs_alive(in_flight: float, virtual: int, last: bool) -> float:
    """Stage outputs a rank group keeps at its peak (ModelFacts.keeps_stage_outputs): one per chunk
    micro-batch alive, in_flight x v (in_flight counts stage micro-batches); none where the group's only
    stage ends in the loss. With v > 1 the group holding the head also counts its last chunk's (an
    over-count of at most one chunk's share: a plan it passes fits)."""
    if last and virtual <= 1:
        return 0.0
    return in_flight * max(1, virtual)


@lru_cache(maxsize=4096)
def interleaved_in_flight(m: int, p: int, s: int, v: int, chunks: Optional[tuple[int, ...]] = None,
                          per_round: Optional[int] = None) -> float:
    """Peak activations of rank group s under torch's Interleaved1F1B with v chunks per group, in
    micro-batches of the group's whole stage: the most layer-micro-batches whose forward has run and
    backward has not, along torch's order (`schedule.interleaved_rank_order`), over the group's layers.
    With equal chunks that is min(W + 1, m v) / v for W = `schedule.interleaved_warmup` (the warm-up
    forwards, then one more forward before each backward): ((v - 1) p + 2 (p - 1 - s) + 1) / v for m
    a multiple of p, about p (1 + 1/v) on the first group and p (v - 1) / v on the last (not 1 + 1/v,
    as this counted before). `chunks` (layers per chunk, in chunk order; e.g. an embedding-only first
    chunk of 0 layers) weights each chunk by its layers: the order is replayed.
    tests/test_planner_interleaved.py compares both with a replay of torch's own order."""
    if chunks is None or len(set(chunks)) <= 1:
        return min(interleaved_warmup(s, p, v, m, per_round) + 1, m * v) / v
    if len(chunks) != v or sum(chunks) <= 0:
        raise ValueError(f"chunks = {chunks}: need v = {v} layer counts with a positive sum")
    live = peak = 0
    for kind, stage, _ in interleaved_rank_order(s, p, v, m, per_round):
        live += chunks[stage // p] * (1 if kind == "F" else -1)
        peak = max(peak, live)
    return peak / sum(chunks)


def zbv_in_flight(m: int, p: int, s: int) -> float:
    """Peak activations of rank group s under ZBVZeroBubble, in micro-batches of its whole stage:
    the most chunk forwards (each half the group's layers) whose weight pass W has not yet run along
    torch's order (`schedule.zbv_rank_order`; a chunk keeps its activations until W: torch's
    backward_input retains the graph for backward_weight). Counting on that order gives
    min(p, (m + 1 + s) / 2, m); tests/test_planner_zero_bubble.py replays the order and compares."""
    return min(p, (m + 1 + s) / 2, m)


def stage_ends(s: int, p: int, schedule: Union[Schedule, str, None] = None) -> tuple[bool, bool]:
    """(holds the embedding, holds the head and loss) for rank group s of p: the first and the last;
    under ZBVZeroBubble both on rank group 0 (its V puts stage 0 and stage 2p - 1 there)."""
    if schedule == Schedule.ZBV_ZERO_BUBBLE:
        return s == 0, s == 0
    return s == 0, s == p - 1


@dataclass
class RepSpec:
    """One replica (a TP group): its chip figures, ranks, rows of each micro-batch, experts hosted."""

    facts: ChipFacts
    ranks: tuple[int, ...]
    mb: int
    experts: Optional[int] = None     # experts hosted (MoE)


@dataclass
class StageSpec:
    """One pipeline stage: its layer range [a, b), replicas in row order, recompute, EP degree."""

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


@dataclass
class Layout:
    """What the simulator needs of a plan: stages, replicas with their chip figures, micro-batches."""

    stages: list[StageSpec]
    m: int                       # micro-batches per step
    zero: int = 0
    schedule: Union[Schedule, str] = Schedule.ONE_F_ONE_B
    node_of: Optional[dict[int, int]] = None   # rank -> node (None: every TP group on one node)
    # True models a runtime that sends a stage's input gradients of the last micro-batch only when
    # backward() returns, i.e. after the DDP / FSDP2 gradient reduction that runs inside that
    # backward (docs/planner.md, "Prediction error"); HeteroPipeline sends first (False).
    send_after_reduction: bool = SEND_AFTER_REDUCTION
    # stages per rank group: > 1 is torch's Interleaved1F1B over `stages` (one per rank group), each
    # stage's layers cut into `virtual` chunks placed round-robin (convert.to_plan); with
    # schedule ZBVZeroBubble, 2 chunks placed in a V (rank group s: stage s and stage 2p - 1 - s)
    virtual: int = 1
    # layers per chunk of each rank group, where a published run cuts them other than sim_chain.chunk_layers
    # (Llama 3's embedding-only first chunk, arXiv 2407.21783 s. 3.3.2): memory only. None: chunk_layers.
    # Published runs only: plan.py refuses a stage of no layers, so to_plan cannot write such a layout
    chunks: Optional[list[tuple[int, ...]]] = None
    # Llama 3's tunable N (contiguous micro-batches per chunk, arXiv 2407.21783 Figure 6) where it is not
    # torch's M // max(1, M // p): memory only (the interleaved step is priced at torch's); published runs only
    per_round: Optional[int] = None

    @property
    def global_batch(self) -> int:
        return self.stages[0].microbatch * self.m


def row_ranges(stage: StageSpec) -> list[tuple[int, int]]:
    """Each replica's rows [a, b) of a micro-batch: the replicas tile it in order."""
    out, o = [], 0
    for r in stage.reps:
        out.append((o, o + r.mb))
        o += r.mb
    return out


def row_links(stages: list[StageSpec]) -> list[list[tuple[int, int, int]]]:
    """Per boundary s -> s+1, every (replica i of stage s, replica k of stage s+1, rows they share):
    what i sends k forward and k sends i back (activations are re-sliced where the DP degree or the
    row split changes). Both stages' ranges tile the micro-batch in order, so the replicas of stage
    s+1 that a replica of stage s overlaps are consecutive and move forward with it: one merge pass,
    linear in the replicas."""
    ranges = [row_ranges(st) for st in stages]
    links = []
    for s in range(len(stages) - 1):
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
    return links


def on_one_node(ranks, node_of: Optional[dict[int, int]]) -> bool:
    """Whether `ranks` share one node; False when the layout has no rank -> node map."""
    return bool(node_of) and len({node_of.get(x) for x in ranks}) == 1
