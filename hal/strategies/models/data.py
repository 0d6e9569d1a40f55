"""Losses and synthetic data shared by every model here: next-token cross entropy (mean, and the
sum-reduced form data-parallel training divides by the global token count) and a learnable token
stream, split over ranks by rows."""
from __future__ import annotations

import torch

import hal.ops as ops

IGNORE_INDEX = -100


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy through hal.ops: logits (b, s, v), targets (b, s)."""
    return ops.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def make_batches(cfg, steps: int, global_batch: int, seed: int = 1) -> torch.Tensor:
    """Token sequences (steps, global_batch, seq + 1) int64 with learnable structure.

    Each sequence walks t -> (t * a + c) mod vocab with a per-sequence stride c, and one token in eight
    is replaced by noise, so the loss falls well below log(vocab) but never to zero.
    """
    if steps < 1 or global_batch < 1:
        raise ValueError(f"make_batches: steps={steps} and global_batch={global_batch} must be >= 1")
    g = torch.Generator().manual_seed(seed)
    n = steps * global_batch
    start = torch.randint(0, cfg.vocab, (n, 1), generator=g)
    stride = torch.randint(1, 4, (n, 1), generator=g)
    pos = torch.arange(cfg.seq + 1).unsqueeze(0)
    walk = (start * 5 + stride * pos * 3) % cfg.vocab
    noise = torch.randint(0, cfg.vocab, walk.shape, generator=g)
    tokens = torch.where(torch.rand(walk.shape, generator=g) < 0.125, noise, walk)
    return tokens.view(steps, global_batch, cfg.seq + 1)


def rank_slice(batch: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's equal share of a global batch (batch, ...) along dim 0."""
    if batch.size(0) % world_size:
        raise ValueError(f"global batch {batch.size(0)} does not split evenly over {world_size} ranks")
    per = batch.size(0) // world_size
    return batch[rank * per:(rank + 1) * per]


def lm_loss_sum(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Summed next-token cross entropy through hal.ops (float32): logits (b, s, v), targets (b, s).

    Divide by the global count of counted targets (`count_tokens` summed over the data-parallel
    group), never by this rank's own count: that is what keeps one step equal to the single-process
    step when ranks hold different numbers of rows (torchtitan's convention)."""
    return ops.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1),
                             ignore_index, "sum")


def count_tokens(targets: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> int:
    """Targets that count towards the loss (not `ignore_index`)."""
    return int((targets != ignore_index).sum().item())
