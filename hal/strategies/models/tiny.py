"""The tiny decoder-only transformer of `hal demo` and the bridge strategy tests, built from `hal.ops`
(kept as it was before hal.strategies.models became a package; new code uses `hal.strategies.models.GPT`).

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


def build_tiny(cfg: TinyConfig, seed: int = 0) -> TinyTransformer:
    """The model with weights N(0, 0.02) (norm gains 1) drawn in parameter-name order from `seed`."""
    model = TinyTransformer(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith("norm"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return model



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

