"""Pipeline schedules: the names a `Plan` may carry and the order in which one stage runs its
micro-batches' forwards and backwards.

One definition for the three places that need it: the plan (which schedule it asks for), the
pipeline runtime (`HeteroPipeline` runs a stage's steps in this order) and the planner's step
simulator (which replays the same order to predict the step). `Schedule` is a `str` enum, so a plan
read from TOML or JSON with `schedule = "1F1B"` loads, and a member compares and hashes equal to its
name as a string (and prints as that name).
"""
from __future__ import annotations

from enum import Enum
from typing import Optional, Union

__all__ = ["Schedule", "MULTI_STAGE_SCHEDULES", "ORDERED_SCHEDULES", "stage_order", "zbv_stage_of",
           "zbv_rank_order", "interleaved_warmup", "interleaved_rank_order"]


class Schedule(str, Enum):
    """A pipeline schedule by the name plans, torch and the command line use."""

    ONE_F_ONE_B = "1F1B"                  # warm-up forwards, one forward one backward, cool-down
    GPIPE = "GPipe"                       # every forward, then every backward
    INTERLEAVED_1F1B = "Interleaved1F1B"  # torch's looped schedule: several stages per rank
    ZBV_ZERO_BUBBLE = "ZBVZeroBubble"     # torch's V schedule: two stages per rank

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:     # messages name the schedule as the plan spells it
        return repr(self.value)

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


# a rank hosts several stages (torch.distributed.pipelining runs these)
MULTI_STAGE_SCHEDULES = (Schedule.INTERLEAVED_1F1B, Schedule.ZBV_ZERO_BUBBLE)
# the schedules `stage_order` lays out (and HeteroPipeline runs)
ORDERED_SCHEDULES = (Schedule.ONE_F_ONE_B, Schedule.GPIPE)


def stage_order(schedule: Union[Schedule, str], stage: int, num_stages: int,
                num_microbatches: int) -> list[tuple[str, int]]:
    """The steps stage `stage` of `num_stages` runs, in order: ("F", j) the forward of micro-batch j,
    ("B", j) its backward.

    1F1B (Narayanan et al. 2021): min(num_stages - 1 - stage, M) warm-up forwards, then one forward
    and one backward in turn, then the remaining backwards; it keeps at most num_stages - stage
    micro-batches' activations alive. GPipe: all M forwards, then all M backwards. Other schedules
    need torch's runtime (several stages per rank) and have no order here: ValueError."""
    m = num_microbatches
    if schedule == Schedule.GPIPE:
        return [("F", j) for j in range(m)] + [("B", j) for j in range(m)]
    if schedule != Schedule.ONE_F_ONE_B:
        raise ValueError(f"schedule {schedule!r}: stage_order lays out {[s.value for s in ORDERED_SCHEDULES]}")
    warm = min(num_stages - 1 - stage, m)
    order = [("F", j) for j in range(warm)]
    for i in range(m - warm):
        order += [("F", warm + i), ("B", i)]
    return order + [("B", j) for j in range(m - warm, m)]


def zbv_stage_of(rank: int, chunk: int, num_ranks: int) -> int:
    """ZBVZeroBubble's V placement: chunk 0 of pipeline rank r is stage r, chunk 1 stage 2p - 1 - r (the
    first and the last stage on rank 0, the two middle stages on rank p - 1)."""
    return rank if chunk == 0 else 2 * num_ranks - 1 - rank


def zbv_rank_order(rank: int, num_ranks: int, num_microbatches: int) -> list[tuple[str, int, int]]:
    """The actions pipeline rank `rank` of `num_ranks` runs under torch's ScheduleZBVZeroBubble, in
    order: (kind, stage, micro-batch) with kind "F" (forward), "I" (backward of the stage input:
    the input gradient) or "W" (backward of the weights), stages numbered in the V
    (`zbv_stage_of`). The same order as torch 2.13's
    `ScheduleZBVZeroBubble._calculate_single_rank_operations` without its idle slots (Qi et al.
    2023, "Zero Bubble Pipeline Parallelism", arXiv 2401.10241, section 6; tests/test_planner_zero_bubble.py
    compares the two): warm-up forwards of chunk 0, then chunk 1's forwards each followed by its I and
    W, a steady phase of F, I, W on each chunk in turn, and a cool-down whose W passes are deferred
    to fill the drain. torch lays the order out for max(2p - 1, M) micro-batches and drops the
    actions of those past M; so does this."""
    p, m = num_ranks, num_microbatches
    n = max(2 * p - 1, m)
    c0, c1 = zbv_stage_of(rank, 0, p), zbv_stage_of(rank, 1, p)
    ops: list[tuple[str, int, int]] = []
    f0 = f1 = b0 = b1 = 0
    for _ in range(2 * (p - rank) - 1):
        ops.append(("F", c0, f0))
        f0 += 1
    for _ in range(rank):
        ops += [("F", c1, f1), ("F", c0, f0)]
        f1, f0 = f1 + 1, f0 + 1
    for _ in range(p - rank):
        ops += [("F", c1, f1), ("I", c1, b1), ("W", c1, b1)]
        f1, b1 = f1 + 1, b1 + 1
    while f1 < f0 or f0 < n:
        if f0 < n:
            ops.append(("F", c0, f0))
            f0 += 1
        ops += [("I", c0, b0), ("W", c0, b0), ("F", c1, f1), ("I", c1, b1), ("W", c1, b1)]
        b0, f1, b1 = b0 + 1, f1 + 1, b1 + 1
    w0, w1 = b0, b1
    for _ in range(rank):
        ops += [("I", c0, b0), ("I", c1, b1)]
        b0, b1 = b0 + 1, b1 + 1
    for _ in range(p - rank):
        ops += [("I", c0, b0), ("W", c0, w0)]
        b0, w0 = b0 + 1, w0 + 1
    ops += [("W", c1, j) for j in range(w1, b1)] + [("W", c0, j) for j in range(w0, b0)]
    return [op for op in ops if op[2] < m]


def interleaved_warmup(rank: int, num_ranks: int, num_chunks: int, num_microbatches: int,
                       per_round: Optional[int] = None) -> int:
    """Chunk forwards pipeline rank `rank` runs before its first backward under torch 2.13's
    ScheduleInterleaved1F1B (`_get_warmup_ops` with its multiply_factor 2): (v - 1) x the micro-batches
    per round + 2 (p - 1 - rank), capped at M v. torch's rounds are max(1, M // p) and its micro-batches
    per round M // rounds (the contiguous micro-batches N of Llama 3's schedule, arXiv 2407.21783,
    section 3.3.2 and Figure 6: p when p divides M, M when M < p). `per_round` replaces torch's N with
    another (Llama 3 tunes it; torch derives it from M)."""
    p, v, m = num_ranks, num_chunks, num_microbatches
    per_round = per_round or m // max(1, m // p)
    return min((v - 1) * per_round + 2 * (p - 1 - rank), m * v)


def interleaved_rank_order(rank: int, num_ranks: int, num_chunks: int, num_microbatches: int,
                           per_round: Optional[int] = None) -> list[tuple[str, int, int]]:
    """The actions pipeline rank `rank` of `num_ranks` runs under torch 2.13's ScheduleInterleaved1F1B
    with `num_chunks` stages per rank, in order: (kind, stage, micro-batch), kind "F" or "B", stage
    c p + rank for the rank's chunk c. The same order as torch's `_calculate_single_rank_operations`
    (`_get_1f1b_rank_ops`) without its idle slots (tests/test_planner_interleaved.py compares the two):
    `interleaved_warmup` forwards, then one forward and one backward in turn, then the remaining
    backwards; forwards walk the chunks upward and backwards downward, each for a round's micro-batches
    in a row. torch requires M to be a multiple of its rounds (ValueError here as there). `per_round`:
    another N than torch's (`interleaved_warmup`)."""
    p, v, m = num_ranks, num_chunks, num_microbatches
    rounds = max(1, m // p)
    if m % rounds:
        raise ValueError(f"num_microbatches = {m}: Interleaved1F1B needs a multiple of its rounds "
                         f"max(1, M // p) = {rounds} (p = {p})")
    per_round = per_round or m // rounds
    warm, total = interleaved_warmup(rank, p, v, m, per_round), m * v
    nxt: dict[tuple[str, int], int] = {}

    def act(kind: str, chunk: int) -> tuple[str, int, int]:
        stage = chunk * p + rank
        j = nxt.get((kind, stage), 0)
        nxt[(kind, stage)] = j + 1
        return kind, stage, j

    ops: list[tuple[str, int, int]] = []
    for step in range(total + warm):
        if step < total:
            ops.append(act("F", (step // per_round) % v))
        if step >= warm:
            ops.append(act("B", v - 1 - ((step - warm) // per_round) % v))
    return ops
