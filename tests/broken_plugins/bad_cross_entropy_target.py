"""Broken plugin: the cross-entropy override treats any target outside [0, C) as ignored.

A kernel that masks `0 <= target < C` instead of `target != ignore_index`: in-range targets and
ignore_index give the reference's loss, so the golden cases pass, but a label past the class count
(a vocabulary mismatch between data and model) is silently dropped from the loss where the reference
raises, and training goes on without the signal.
"""
import torch

import hal

from ._base import install

BUG = "cross_entropy silently ignores targets outside [0, C) instead of raising"
CAUGHT_BY = "ops.refusals.cross_entropy"
LEVELS = ["ops"]
SELECT = ["ops.refusals.cross_entropy", "ops.cross_entropy.float32"]
STILL_PASSES = ["ops.cross_entropy.float32"]
MESSAGE = ["target_ge_classes", "instead of raising"]


def cross_entropy(logits, target, ignore_index=-100, reduction="mean"):
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"cross_entropy: reduction {reduction!r}")
    logp = torch.log_softmax(logits.float(), dim=-1)
    keep = (target >= 0) & (target < logits.shape[-1]) & (target != ignore_index)  # the bug: drops bad labels
    safe = torch.where(keep, target, torch.zeros_like(target))
    nll = -logp.gather(-1, safe.unsqueeze(-1)).squeeze(-1) * keep
    if reduction == "none":
        return nll.to(logits.dtype)
    total = nll.sum()
    return (total if reduction == "sum" else total / keep.sum().clamp(min=1)).to(logits.dtype)


install(globals(), "bad_cross_entropy_target", BUG,
        kernels=lambda: [hal.OpKernel("cross_entropy", cross_entropy, priority=10, name="lenient_cross_entropy")])
