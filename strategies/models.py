"""A small decoder-only transformer built from `hal.ops`, plus its synthetic data, for strategy tests
and `hal demo`.

Every op of the forward pass goes through the HAL (embedding, rms_norm, linear, causal
scaled_dot_product_attention, swiglu, cross_entropy), so training it on a mixed cluster exercises each
rank's chip kernels. Parameters are initialised from a private generator seeded by `seed`, so the same
config and seed give bit-identical models in every process, whatever the global RNG state.
`split_stages` cuts the model into pipeline stages that hold the very same parameter names.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import torch
from torch import nn

import hal.ops as ops


@dataclass(frozen=True)
class TinyConfig:
    """Sizes of the model and its data. `ffn` is the swiglu width (the up-projection is 2 x ffn)."""

    vocab: int = 64
    dim: int = 32
    heads: int = 4
    layers: int = 4
    ffn: int = 64
    seq: int = 16

    def __post_init__(self) -> None:
        for field, value in asdict(self).items():
            if value < 1:
                raise ValueError(f"TinyConfig.{field} must be >= 1, got {value}")
        if self.dim % self.heads:
            raise ValueError(f"TinyConfig: dim={self.dim} is not divisible by heads={self.heads}")

    def num_params(self) -> int:
        per_block = 2 * self.dim + 4 * self.dim * self.dim + 3 * self.dim * self.ffn
        return 2 * self.vocab * self.dim + self.layers * per_block + self.dim


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape))


class Embed(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.weight = _param(cfg.vocab, cfg.dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return ops.embedding(ids, self.weight)


class Block(nn.Module):
    """Pre-norm block: x + attn(rms_norm(x)), then x + swiglu_mlp(rms_norm(x))."""

    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.attn_norm = nn.Parameter(torch.ones(cfg.dim))
        self.wqkv = _param(3 * cfg.dim, cfg.dim)
        self.wo = _param(cfg.dim, cfg.dim)
        self.mlp_norm = nn.Parameter(torch.ones(cfg.dim))
        self.w_up = _param(2 * cfg.ffn, cfg.dim)
        self.w_down = _param(cfg.dim, cfg.ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        qkv = ops.linear(ops.rms_norm(x, self.attn_norm), self.wqkv)
        q, k, v = qkv.view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        a = ops.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, heads, s, d/heads)
        x = x + ops.linear(a.transpose(1, 2).reshape(b, s, d), self.wo)
        h = ops.swiglu(ops.linear(ops.rms_norm(x, self.mlp_norm), self.w_up))
        return x + ops.linear(h, self.w_down)


class Head(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.norm = nn.Parameter(torch.ones(cfg.dim))
        self.weight = _param(cfg.vocab, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(ops.rms_norm(x, self.norm), self.weight)


class TinyTransformer(nn.Module):
    """ids (batch, seq) int64 -> logits (batch, seq, vocab)."""

    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = Embed(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.head = Head(cfg)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build_model(cfg: TinyConfig, seed: int = 0) -> TinyTransformer:
    """The model with weights N(0, 0.02) (norm gains 1) drawn in parameter-name order from `seed`."""
    model = TinyTransformer(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith("norm"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return model


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy through hal.ops: logits (b, s, v), targets (b, s)."""
    return ops.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def make_batches(cfg: TinyConfig, steps: int, global_batch: int, seed: int = 1) -> torch.Tensor:
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


class StageModule(nn.Module):
    """One pipeline stage: optionally the embedding, a run of blocks, optionally the head.

    Attribute names match TinyTransformer's (`embed`, `blocks.<i>`, `head`) with the global block
    index, so `named_parameters()` of a stage are the reference model's names for the same weights.
    """

    def __init__(self, model: TinyTransformer, first: bool, last: bool, block_ids: Sequence[int]) -> None:
        super().__init__()
        self.embed = model.embed if first else None
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in block_ids})
        self.head = model.head if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks.values():
            x = block(x)
        return self.head(x) if self.head is not None else x


def split_stages(model: TinyTransformer, num_stages: int) -> list[StageModule]:
    """Cut the blocks into `num_stages` contiguous runs (the first runs one longer when uneven)."""
    layers = model.cfg.layers
    if not 1 <= num_stages <= layers:
        raise ValueError(f"split_stages: num_stages={num_stages} must be in 1..layers={layers}")
    base, extra = divmod(layers, num_stages)
    stages, start = [], 0
    for i in range(num_stages):
        n = base + (1 if i < extra else 0)
        stages.append(StageModule(model, i == 0, i == num_stages - 1, range(start, start + n)))
        start += n
    return stages

