"""Data parallelism with uneven micro-batches: torch's own DistributedDataParallel on any process group
(`hetero` included), with the gradient maths of one step on the whole global batch.

Ranks of a mixed cluster take different numbers of rows (a Plan's `Replica.microbatch`: a faster chip
takes more). Averaging per-rank mean losses would then weight a slow rank's rows more than a fast
rank's. So, as torchtitan does: each rank's loss is the SUM of its token losses divided by the
GLOBAL token count (all-reduced over the DP group, `global_token_count`), and the wrapper's own
gradient averaging is switched off (DDP: `sum_allreduce_hook` replaces the reducer's divide-by-world-
size; FSDP2: hal.strategies.sharded_data_parallel.disable_gradient_division). The summed gradient is then
exactly the gradient of the mean loss over every token of the global batch. Every rank runs the same
number of micro-batches (`accumulate`), so the collectives of every rank stay matched.

Smaller buckets than DDP's 25 MB default let the first gradient all_reduce start (and cross the
bridge) while backward is still running; the caller picks the size.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .models.data import IGNORE_INDEX, count_tokens, lm_loss_sum


def sum_allreduce_hook(group, bucket):  # no annotations: DDP checks them, and ours are strings
    """DDP comm hook (group: ProcessGroup or None, bucket: dist.GradBucket) -> Future of the bucket:
    SUM all-reduce of the bucket, no division by the group size.

    With a comm hook registered, DDP's reducer copies gradients into the bucket without dividing
    (torch/csrc/distributed/c10d/reducer.cpp divides only when no hook is set; the stock
    `default_hooks.allreduce_hook` divides itself), so this hook leaves the plain sum."""
    fut = dist.all_reduce(bucket.buffer(), group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def wrap_ddp(model: nn.Module, group: Optional[dist.ProcessGroup] = None, bucket_cap_mb: float = 25.0,
             sum_gradients: bool = False) -> DistributedDataParallel:
    """DDP over `group` (default: the world); parameters are broadcast from the group's first rank.

    `sum_gradients=True` switches DDP's averaging off (the loss must then be normalised by the global
    token count, see the module docstring); False keeps DDP's mean, right only for equal splits."""
    ddp = DistributedDataParallel(model, process_group=group, bucket_cap_mb=bucket_cap_mb)
    if sum_gradients:
        ddp.register_comm_hook(group, sum_allreduce_hook)
    return ddp


def global_token_count(targets: Sequence[torch.Tensor], group: Optional[dist.ProcessGroup] = None,
                       ignore_index: int = IGNORE_INDEX) -> int:
    """Counted targets of this step over the whole DP group (one int64 SUM all-reduce); `targets` are
    this rank's micro-batches of the step."""
    n = torch.tensor([sum(count_tokens(t, ignore_index) for t in targets)], dtype=torch.int64)
    dist.all_reduce(n, group=group)
    return int(n.item())


def _sync_context(model: nn.Module, last: bool):
    """Gradient sync only on the last micro-batch: DDP's no_sync, FSDP2's set_requires_gradient_sync."""
    if isinstance(model, DistributedDataParallel):
        return nullcontext() if last else model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # an FSDP2 module (fully_shard)
        model.set_requires_gradient_sync(last)
    return nullcontext()


def accumulate(model: nn.Module, micro_inputs: Sequence[torch.Tensor], micro_targets: Sequence[torch.Tensor],
               num_tokens: int, loss_sum_fn: Callable = lm_loss_sum) -> torch.Tensor:
    """Forward and backward over this rank's micro-batches (rows may differ by rank, the count may not),
    each loss = loss_sum / num_tokens (the global token count), gradients reduced on the last one.

    Returns this rank's share of the step's mean loss (detached); SUM it over the DP group for the
    global mean. A MoE model's aux loss (model.aux_loss(), already a per-rank share) is added once per
    micro-batch divided by the micro-batch count."""
    if len(micro_inputs) != len(micro_targets) or not micro_inputs:
        raise ValueError(f"accumulate: {len(micro_inputs)} input and {len(micro_targets)} target "
                         f"micro-batches; need the same number, >= 1")
    if num_tokens < 1:
        raise ValueError(f"accumulate: num_tokens = {num_tokens}; the global token count must be >= 1")
    inner = model.module if isinstance(model, DistributedDataParallel) else model
    total = torch.zeros((), dtype=torch.float32)
    m = len(micro_inputs)
    for i, (x, y) in enumerate(zip(micro_inputs, micro_targets)):
        with _sync_context(model, last=i == m - 1):
            loss = loss_sum_fn(model(x), y) / num_tokens
            aux = inner.aux_loss() if hasattr(inner, "aux_loss") else None
            total += loss.detach().float()
            (loss if aux is None else loss + aux / m).backward()
    return total


def replica_microbatches(batch: torch.Tensor, num_microbatches: int, rows: tuple[int, int]) -> list[torch.Tensor]:
    """This replica's rows of each micro-batch of a global batch (global_batch, ...): micro-batch m is
    rows [m*S, (m+1)*S) with S = global_batch / num_microbatches, and the replica takes its [start,
    end) of each (a Plan's `rows(stage, replica)`)."""
    g = batch.size(0)
    if g % num_microbatches:
        raise ValueError(f"global batch of {g} rows does not split into {num_microbatches} micro-batches")
    size = g // num_microbatches
    start, end = rows
    if not 0 <= start < end <= size:
        raise ValueError(f"rows [{start}, {end}) do not fit a micro-batch of {size} rows")
    # (g, ...) -> (num_microbatches, size, ...): micro-batch m is view[m]
    view = batch.view(num_microbatches, size, *batch.shape[1:])
    return [view[m, start:end] for m in range(num_microbatches)]
