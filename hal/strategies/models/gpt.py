"""`GPT`: a Llama-style decoder-only transformer sized by a `ModelConfig` (RMSNorm, rotary attention,
SwiGLU MLP, or a MoE FFN when `experts > 0`), every op through `hal.ops`.

Module names are the contract the strategies shard by (tensor parallel plans name them):
    embed (token embedding) . blocks[i] (.attn_norm, .attn (.wq .wk .wv .wo), .ffn_norm, and .mlp
    (.w1 gate, .w3 up, .w2 down) or .moe (hal.strategies.moe.MoE)) . norm . head
The linears are `HalLinear`, an `nn.Linear` whose forward is `hal.ops.linear`, so torch's
`parallelize_module` (which checks for nn.Linear and hooks the module call) shards them, and the op
still runs on the chip's kernel. Attention reads the number of heads from the local width of wq's
output (`width // head_dim`), so a column-sharded wq gives each TP rank its own heads unchanged.
`embed`, `norm` and `head` may be set to None (a pipeline stage without them); forward skips them.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

import hal.ops as ops

from .config import ModelConfig


class HalLinear(nn.Linear):
    """nn.Linear (no bias by default) computed by hal.ops.linear."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__(in_features, out_features, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)


class Embedding(nn.Module):
    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab, dim))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return ops.embedding(ids, self.weight)


def rotary_tables(seq: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (seq, head_dim) for hal.ops.rotary_embedding's rotate-half convention (Llama/NeoX)."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)   # (head_dim/2,)
    freqs = torch.outer(torch.arange(seq, dtype=torch.float64), inv)                     # (seq, head_dim/2)
    ang = torch.cat((freqs, freqs), dim=-1)                                               # (seq, head_dim)
    return ang.cos().float(), ang.sin().float()


class Attention(nn.Module):
    """Causal multi-head attention with rotary positions: wq, wk, wv (hidden -> hidden), wo."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h = cfg.hidden
        self.head_dim = cfg.head_dim
        self.wq, self.wk, self.wv, self.wo = (HalLinear(h, h) for _ in range(4))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        d = self.head_dim
        # (b, s, local_heads * d) -> (b, s, local_heads, d); local_heads = heads / tp under TP
        q = self.wq(x).view(b, s, -1, d)
        k = self.wk(x).view(b, s, -1, d)
        v = self.wv(x).view(b, s, -1, d)
        c, sn = cos[:s].view(1, s, 1, d), sin[:s].view(1, s, 1, d)
        q, k = ops.rotary_embedding(q, c, sn), ops.rotary_embedding(k, c, sn)
        # (b, s, heads, d) -> (b, heads, s, d) for attention, and back to (b, s, heads * d)
        a = ops.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=True)
        return self.wo(a.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.w1, self.w3, self.w2 = HalLinear(hidden, ffn), HalLinear(hidden, ffn), HalLinear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(ops.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Pre-norm decoder block: x + attn(norm(x)), then x + ffn(norm(x)) with ffn = mlp or moe."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        if cfg.is_moe:
            from hal.strategies.moe import MoE  # H4's layer; imported only for MoE models
            self.moe = MoE(cfg.hidden, cfg.ffn, cfg.experts, top_k=cfg.top_k,
                           capacity_factor=cfg.capacity_factor)
        else:
            self.mlp = MLP(cfg.hidden, cfg.ffn)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        ffn = self.moe if hasattr(self, "moe") else self.mlp
        return x + ffn(self.ffn_norm(x))


class GPT(nn.Module):
    """ids (batch, seq) int64 -> logits (batch, seq, vocab); a stage without embed takes hidden states."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed: Optional[Embedding] = Embedding(cfg.vocab, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm: Optional[RMSNorm] = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.head: Optional[HalLinear] = HalLinear(cfg.hidden, cfg.vocab)
        cos, sin = rotary_tables(cfg.seq, cfg.head_dim, cfg.rope_theta)
        # not persistent: derived from the config, so checkpoints and FSDP state stay weights only
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.size(1) > self.cfg.seq:
            raise ValueError(f"GPT: sequence length {x.size(1)} exceeds the config's seq = {self.cfg.seq}")
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks:
            x = block(x, self.rope_cos, self.rope_sin)
        if self.norm is not None:
            x = self.norm(x)
        return self.head(x) if self.head is not None else x

    def aux_loss(self) -> Optional[torch.Tensor]:
        """moe_aux_loss_coef x the sum of the last forward's MoE load-balancing losses (None if dense).

        Each EP rank's MoE layer holds its share of the global aux loss, so adding this to the
        rank's (globally normalised) loss and SUM-reducing gradients gives the single-process step."""
        parts = [b.moe.aux_loss for b in self.blocks if hasattr(b, "moe") and b.moe.aux_loss is not None]
        if not parts:
            return None
        return self.cfg.moe_aux_loss_coef * torch.stack(parts).sum()


def build_gpt(cfg: ModelConfig, seed: int = 0) -> GPT:
    """GPT with weights N(0, 0.02) (norm gains 1) drawn in parameter-name order from `seed`, so every
    process builds the bit-identical model whatever its global RNG state."""
    model = GPT(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return model
