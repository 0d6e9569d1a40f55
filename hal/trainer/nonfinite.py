"""Non-finite training (`[train] on_nonfinite`): a NaN or infinite loss, gradient or global grad norm never
goes on silently, and a non-finite model is never checkpointed.

After each step's backward, before the optimizer, every rank looks at its own gradients (one
`isfinite` pass; a data-parallel replica whose gradients are not counted in the global norm is covered
too) and the ranks agree with one all_reduce of a flag on the bookkeeping group (bounded by the run's
`timeout_s`). Then, as Megatron-LM and torchtitan do:

  stop (default)  every rank raises `NonFiniteError` naming the step, the first rank with a non-finite
                  gradient and its first non-finite parameter (the model's own name, e.g.
                  `blocks.1.attn.wq.weight`), the loss and the grad norm; no checkpoint is written
  skip            every rank skips the optimizer step (gradients dropped, parameters and AdamW state
                  unchanged) and counts it; one warning line per skipped step; the step records and
                  summary.json carry the count (`nonfinite_skipped`); more than `train.max_skipped` skipped
                  steps stop the run as above

`Checkpointer.save` (hal.trainer.checkpoint) checks the parameters the same way before writing, so even
a non-finite model that got past this (a NaN put into a parameter directly) is never saved.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist

from hal.contract.errors import HalError

log = logging.getLogger(__name__)

Named = Sequence[tuple[str, torch.Tensor]]


class NonFiniteError(HalError):
    """Training produced a NaN or infinity (loss, gradient, grad norm or parameter); the message names the
    step, the rank and the first non-finite parameter."""


def named_parameters(run: Any) -> list[tuple[str, torch.nn.Parameter]]:
    """This rank's parameters by the full model's names (stage modules keep the model's attribute names;
    DDP's `.module` unwrapped)."""
    out = []
    for s in sorted(run.modules):
        inner = getattr(run.modules[s], "module", run.modules[s])
        out.extend(inner.named_parameters())
    return out


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # a DTensor: this rank's shard


def first_nonfinite(named: Named, grads: bool) -> Optional[str]:
    """Name of the first parameter whose gradient (`grads`) or value holds a NaN or infinity; None when
    all are finite. One device sync in the common case (all finite)."""
    tensors = [(n, p.grad if grads else p) for n, p in named]
    tensors = [(n, _local(t.detach())) for n, t in tensors if t is not None]
    if not tensors or bool(torch.stack([torch.isfinite(t).all() for _, t in tensors]).all()):
        return None
    return next(n for n, t in tensors if not bool(torch.isfinite(t).all()))


def agree(name: Optional[str], group: Any) -> Optional[tuple[int, str]]:
    """Collective on `group`: (first rank, its parameter name) when any rank found a non-finite tensor,
    else None. One all_reduce of a flag; the names are gathered only when one is set."""
    flag = torch.tensor([0.0 if name is None else 1.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    if flag.item() == 0.0:
        return None
    names: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(names, name, group=group)
    return next((r, n) for r, n in enumerate(names) if n is not None)


class NonFiniteGuard:
    """One rank's check after each backward (collective: every rank calls `check` at every step)."""

    def __init__(self, train_section: Any, rank: int, group: Any) -> None:
        self.mode, self.max_skipped = train_section.on_nonfinite, train_section.max_skipped
        self.rank, self.group = rank, group
        self.skipped = 0

    def check(self, step: int, loss: float, grad_norm: float, named: Named) -> bool:
        """True: skip this step's optimizer step (mode skip). Raises NonFiniteError in mode stop, or when
        the skipped steps exceed `max_skipped`. `step` is 1-based, as printed."""
        where = agree(first_nonfinite(named, grads=True), self.group)
        if where is None and math.isfinite(loss) and math.isfinite(grad_norm):
            return False
        what = (f"non-finite gradient on rank {where[0]}: first non-finite parameter {where[1]}" if where
                else "non-finite loss or grad norm (every gradient finite)")
        what += f" (loss {loss:.6g}, grad norm {grad_norm:.6g})"
        if self.mode == "stop":
            raise NonFiniteError(f"step {step}: {what}; run stopped, no checkpoint written (train.on_nonfinite "
                                 f"= 'stop'; 'skip' skips such steps)")
        self.skipped += 1
        if self.skipped > self.max_skipped:
            raise NonFiniteError(f"step {step}: {what}; {self.skipped} steps skipped, more than train.max_skipped "
                                 f"= {self.max_skipped}: run stopped")
        if self.rank == 0:
            log.warning(f"hal train: WARNING: step {step}: {what}; optimizer step skipped on every rank "
                        f"({self.skipped} of at most {self.max_skipped}, train.on_nonfinite = 'skip')")
        return True


def check_params_before_save(named: Named, step: int, group: Any) -> None:
    """Collective: NonFiniteError on every rank when any rank's parameters hold a NaN or infinity."""
    where = agree(first_nonfinite(named, grads=False), group)
    if where is not None:
        raise NonFiniteError(f"checkpoint of step {step} not written: parameter {where[1]} on rank {where[0]} "
                             f"is non-finite")
