"""Pipeline parallelism: torch.distributed.pipelining schedules over any process group.

`build_pipeline` gives this rank its stage (a `PipelineStage` over `group`, stage index = group rank)
and a schedule (`1f1b` = Schedule1F1B, `gpipe` = ScheduleGPipe); `pipeline_step` runs one training
step, feeding inputs on the first stage and targets on the last, as torch's schedules expect.
Schedules average the loss over micro-batches (`scale_grads=True`), so one step equals one step of
the unsplit model on the whole batch with a mean loss.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

SCHEDULES = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}


def build_pipeline(stage_module: nn.Module, group: dist.ProcessGroup, n_microbatches: int,
                   loss_fn: Callable, schedule: str = "1f1b",
                   device: Optional[torch.device] = None):
    """(PipelineStage, schedule) for this rank: stage index = its rank in `group`."""
    if schedule not in SCHEDULES:
        raise ValueError(f"build_pipeline: schedule={schedule!r}; expected one of {sorted(SCHEDULES)}")
    num_stages = dist.get_world_size(group)
    if n_microbatches < 1:
        raise ValueError(f"build_pipeline: n_microbatches={n_microbatches} must be >= 1")
    stage = PipelineStage(stage_module, dist.get_rank(group), num_stages,
                          device or torch.device("cpu"), group=group)
    return stage, SCHEDULES[schedule](stage, n_microbatches=n_microbatches, loss_fn=loss_fn)


def pipeline_step(stage: PipelineStage, sched, inputs: torch.Tensor, targets: torch.Tensor) -> Optional[torch.Tensor]:
    """One forward+backward over the whole batch; returns the mean loss on the last stage, else None."""
    losses: list = []
    args = (inputs,) if stage.is_first else ()
    kwargs = {"target": targets, "losses": losses} if stage.is_last else {}
    sched.step(*args, **kwargs)
    return torch.stack(losses).mean().detach() if stage.is_last else None
