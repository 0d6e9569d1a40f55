"""`GPT`: a Llama-style decoder-only transformer sized by a `ModelConfig` (RMSNorm, rotary attention
with grouped-query K/V heads, optional q/k biases and q/k norms, Llama 3.1 rope scaling, SwiGLU MLP,
or a MoE FFN with optional shared experts when `experts > 0`, optionally tied head), every op
through `hal.ops`. One class covers the Llama, Qwen2, Qwen3, Mixtral and Qwen-MoE families
(hal/strategies/models/hf_map.py maps their Hugging Face checkpoints onto these names).

Module names are the contract the strategies shard by (tensor parallel plans name them):
    embed (token embedding) . blocks[i] (.attn_norm, .attn (.wq .wk .wv .wo [.q_norm .k_norm]),
    .ffn_norm, and .mlp (.w1 gate, .w3 up, .w2 down) or .moe (hal.strategies.moe.MoE: .router,
    .experts[e], [.shared (an MLP), .shared_gate])) . norm . head
The linears are `HalLinear`, an `nn.Linear` whose forward is `hal.ops.linear`, so torch's
`parallelize_module` (which checks for nn.Linear and hooks the module call) shards them, and the op
still runs on the chip's kernel. Attention reads the number of query and K/V heads from the local
widths of wq's and wk's outputs (`width // head_dim`), so column-sharded wq/wk/wv give each TP rank
its own heads/tp query heads and kv_heads/tp K/V heads, the same grouping as the whole model.
GQA repeats each K/V head to its heads / kv_heads query heads (`repeat_interleave` on the head dim,
HF's `repeat_kv` order) before `hal.ops.scaled_dot_product_attention`.
With `tie_embeddings` the head's weight IS the embedding's Parameter (one tensor, named
`embed.weight` by named_parameters); a pipeline split that puts embed and head on different stages
cannot keep that (not supported).
`embed`, `norm` and `head` may be set to None (a pipeline stage without them); forward skips them.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

import hal.ops as ops

from ..errors import ModelConfigError
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


def scale_frequencies(inv: torch.Tensor, scaling) -> torch.Tensor:
    """Llama 3.1 rope scaling of inverse frequencies `inv` (a ModelConfig.rope_scaling): long
    wavelengths divided by `factor`, short ones kept, the band between interpolated (Meta's
    `apply_scaling`, transformers' `_compute_llama3_parameters`)."""
    old = scaling.original_max_position
    low_wavelen, high_wavelen = old / scaling.low_freq_factor, old / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv
    out = torch.where(wavelen > low_wavelen, inv / scaling.factor, inv)
    smooth = (old / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * out / scaling.factor + smooth * out
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, out)


def rotary_tables(seq: int, head_dim: int, theta: float, scaling=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (seq, head_dim) for hal.ops.rotary_embedding's rotate-half convention (Llama/NeoX,
    also Hugging Face's: its q/k weights need no permutation); `scaling` a ModelConfig.rope_scaling."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)   # (head_dim/2,)
    if scaling is not None:
        inv = scale_frequencies(inv, scaling)
    freqs = torch.outer(torch.arange(seq, dtype=torch.float64), inv)                     # (seq, head_dim/2)
    ang = torch.cat((freqs, freqs), dim=-1)                                               # (seq, head_dim)
    return ang.cos().float(), ang.sin().float()


class Attention(nn.Module):
    """Causal grouped-query attention with rotary positions: wq (hidden -> heads x head_dim), wk, wv
    (hidden -> kv_heads x head_dim; all three with biases when qkv_bias), wo (heads x head_dim ->
    hidden); with qk_norm an RMSNorm over head_dim on q and k (q_norm, k_norm) before rotary."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.windowed_layers():   # a planner costing fact only; this decoder attends over the whole prefix
            raise ModelConfigError("sliding_window", cfg.sliding_window, "sliding-window attention is not "
                                   "implemented in hal's decoder (full causal attention only)")
        h, bias = cfg.hidden, cfg.qkv_bias
        self.head_dim = cfg.head_dim
        self.wq = HalLinear(h, cfg.q_dim, bias=bias)
        self.wk = HalLinear(h, cfg.kv_dim, bias=bias)
        self.wv = HalLinear(h, cfg.kv_dim, bias=bias)
        self.wo = HalLinear(cfg.q_dim, h)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        d = self.head_dim
        # (b, s, local_heads * d) -> (b, s, local_heads, d); local_heads = heads / tp under TP
        q = self.wq(x).view(b, s, -1, d)
        k = self.wk(x).view(b, s, -1, d)
        v = self.wv(x).view(b, s, -1, d)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        c, sn = cos[:s].view(1, s, 1, d), sin[:s].view(1, s, 1, d)
        q, k = ops.rotary_embedding(q, c, sn), ops.rotary_embedding(k, c, sn)
        # (b, s, heads, d) -> (b, heads, s, d) for attention, and back to (b, s, heads * d)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        group = q.size(1) // k.size(1)
        if group > 1:  # GQA: K/V head j serves query heads j*group .. (j+1)*group - 1 (HF repeat_kv)
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        a = ops.scaled_dot_product_attention(q, k, v, is_causal=True)
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
                           capacity_factor=cfg.capacity_factor, norm_topk_prob=cfg.norm_topk_prob,
                           shared_ffn=cfg.shared_ffn if cfg.shared_experts else 0,
                           shared_gate=cfg.shared_expert_gate)
        else:
            self.mlp = MLP(cfg.hidden, cfg.ffn)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        ffn = self.moe if hasattr(self, "moe") else self.mlp
        return x + ffn(self.ffn_norm(x))


class GPT(nn.Module):
    """ids (batch, seq) int64 -> logits (batch, seq, vocab); a stage without embed takes hidden states."""

    def __init__(self, cfg: ModelConfig, seed: int = 0) -> None:
        """Built on a real device, every parameter is initialised (hal.strategies.models.init.init_value of
        `seed`, its name and shape: the values `build_model(cfg, seed)` and every rank of any plan hold);
        on the meta device or fake tensors (shape-only builds, `build_model`'s meta construction) nothing
        is written."""
        super().__init__()
        self.cfg = cfg
        self.embed: Optional[Embedding] = Embedding(cfg.vocab, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm: Optional[RMSNorm] = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.head: Optional[HalLinear] = HalLinear(cfg.hidden, cfg.vocab)
        self._tie()
        cos, sin = rotary_tables(cfg.seq, cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        # not persistent: derived from the config, so checkpoints and FSDP state stay weights only
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        from .init import fill, real_parameters
        names = real_parameters(self)
        if names:
            fill(self, seed, names=names)

    def _tie(self) -> None:
        """With tie_embeddings, make the head's weight the embedding's Parameter (again)."""
        if self.cfg.tie_embeddings and self.embed is not None and self.head is not None:
            self.head.weight = self.embed.weight

    def _apply(self, fn, recurse=True):
        """nn.Module._apply (to, to_empty, materialising meta parameters) makes a new Parameter per
        module when the tensor type changes, which unties a tied head: tie it again afterwards."""
        out = super()._apply(fn, recurse)
        self._tie()
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.size(1) > self.cfg.seq:
            raise ValueError(f"GPT: sequence length {x.size(1)} exceeds the config's seq = {self.cfg.seq}")
        if self.cfg.tie_embeddings and (self.embed is None) != (self.head is None):
            raise ModelConfigError("tie_embeddings", True, "this pipeline stage holds the "
                                   f"{'head' if self.embed is None else 'embedding'} but not the "
                                   f"{'embedding' if self.embed is None else 'head'}; a tied head needs both on "
                                   "one stage (one stage, or tie_embeddings = false)")
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
