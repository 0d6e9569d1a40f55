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
from typing import Union

__all__ = ["Schedule", "MULTI_STAGE_SCHEDULES", "ORDERED_SCHEDULES", "stage_order"]


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
