"""`ModelConfig`: the sizes of a GPT-style decoder (dense or MoE) and the per-layer parameter, FLOP and
byte counts the planner prices a layout with, all from the same numbers.

Counts (h = hidden, f = ffn, s = seq, a = heads, V = vocab, E = experts, k = top_k):
- parameters of a dense block: attention 4h^2 (wq, wk, wv, wo; no biases) + SwiGLU MLP 3hf (w1, w3,
  w2) + 2h (two RMSNorm gains). With f = 8h/3 (the SwiGLU width of Llama) 4h^2 + 3hf = 12h^2, the
  "12 L h^2" of REFERENCE.md. A MoE block has E experts of 3hf each and a router of hE instead of
  the MLP. Embedding Vh; head Vh (untied) + its norm h.
- training FLOPs per token of a block, forward + backward = 3 x forward, forward = 2 x (weights a
  token meets: 4h^2 + 3hf, or k x 3hf + hE for MoE) + 4sh (QK^T and AV over the full sequence, as
  Megatron counts it). So a dense block is 6 x params x token plus 12sh, and with f = 8h/3 it is
  72h^2 + 12sh: REFERENCE's 72 B s L h^2 (1 + s/(6h)) per layer. Full recompute adds one forward
  (4 x forward: REFERENCE's "8 with full recompute"). The head costs 6Vh per token.
- activation bytes per block and micro-batch of b sequences: REFERENCE's estimate (Korthikanti et
  al. 2022, 16-bit activations) s b h (10 + 24/t + 5 a s / (h t)) with TP degree t (34 + 5as/h at
  t = 1); with full recompute only the block input is kept, 2 s b h. It was derived for a GeLU MLP
  of width 4h with dropout; here it is an estimate for our SwiGLU blocks, not a measurement.
  `attention="fused"` drops the 5as/h term a flash-style kernel never stores; measured against a
  real block in docs/performance.md (benchmarks/activation_memory.py): within about 1.5x.
- training-state bytes per parameter with mixed-precision Adam (REFERENCE): 16 plain DP; ZeRO-2
  2 + 14/d; ZeRO-3 16/d over a DP group of d.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional, Union

from pydantic import ConfigDict, Field, model_validator

from ..errors import FieldErrorModel, ModelConfigError, read_toml


class ModelConfig(FieldErrorModel):
    """Sizes of a decoder-only transformer; experts = 0 means dense."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    field_error = ModelConfigError

    name: str = Field(min_length=1)
    layers: int = Field(ge=1, description="decoder blocks")
    hidden: int = Field(ge=1)
    heads: int = Field(ge=1, description="attention heads (hidden / heads = head dim, even for rotary)")
    ffn: int = Field(ge=1, description="SwiGLU width (of each expert in a MoE model)")
    vocab: int = Field(ge=2)
    seq: int = Field(ge=1, description="sequence length (positions of the rotary table)")
    experts: int = Field(default=0, ge=0, description="0 = dense; else experts per MoE layer")
    top_k: int = Field(default=2, ge=1)
    capacity_factor: Optional[float] = Field(default=1.25, description="<= 0 or None: no token dropping")
    moe_aux_loss_coef: float = Field(default=0.01, ge=0)
    rope_theta: float = Field(default=10000.0, gt=0)
    norm_eps: float = Field(default=1e-6, gt=0)

    @model_validator(mode="after")
    def _sizes(self) -> "ModelConfig":
        if self.hidden % self.heads:
            raise ModelConfigError("hidden", self.hidden, f"not divisible by heads = {self.heads} "
                                   f"({self.hidden} % {self.heads} = {self.hidden % self.heads})")
        if (self.hidden // self.heads) % 2:
            raise ModelConfigError("hidden", self.hidden, f"head dim hidden / heads = {self.hidden} / "
                                   f"{self.heads} = {self.hidden // self.heads} is odd; rotary embedding "
                                   f"rotates pairs, so it must be even")
        if self.experts and self.top_k > self.experts:
            raise ModelConfigError("top_k", self.top_k, f"exceeds experts = {self.experts}")
        return self

    @classmethod
    def from_toml(cls, path: Union[str, Path]) -> "ModelConfig":
        """Read a config file: its fields at top level (or under a `[model]` table)."""
        data = read_toml(path, ModelConfigError, "model config")
        if isinstance(data.get("model"), dict):
            data = data["model"]
        return cls(**data)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    # ---- parameters ------------------------------------------------------------------------------
    def layer_params(self) -> int:
        """Parameters of one decoder block (see the module docstring)."""
        h, f = self.hidden, self.ffn
        ffn = self.experts * 3 * h * f + h * self.experts if self.is_moe else 3 * h * f
        return 4 * h * h + ffn + 2 * h

    def embed_params(self) -> int:
        return self.vocab * self.hidden

    def head_params(self) -> int:
        """Final norm and output projection (untied from the embedding)."""
        return self.vocab * self.hidden + self.hidden

    def num_params(self) -> int:
        return self.embed_params() + self.layers * self.layer_params() + self.head_params()

    def layer_param_bytes(self, bytes_per_param: int = 2) -> int:
        """Bytes of one block's weights (2: bf16/fp16 weights)."""
        return self.layer_params() * bytes_per_param

    # ---- FLOPs -----------------------------------------------------------------------------------
    def layer_forward_flops(self, tokens: int, seq: Optional[int] = None) -> int:
        """Forward FLOPs of one block over `tokens` tokens in sequences of `seq` (default cfg.seq)."""
        h, f, s = self.hidden, self.ffn, seq or self.seq
        ffn = (self.top_k * 3 * h * f + h * self.experts) if self.is_moe else 3 * h * f
        return tokens * (2 * (4 * h * h + ffn) + 4 * s * h)

    def layer_flops(self, tokens: int, recompute: Literal["none", "full"] = "none",
                    seq: Optional[int] = None) -> int:
        """Training FLOPs (forward + backward, + one more forward with full recompute) of one block."""
        passes = {"none": 3, "full": 4}[recompute]
        return passes * self.layer_forward_flops(tokens, seq)

    def head_flops(self, tokens: int) -> int:
        """Training FLOPs of the output projection (forward + backward); the embedding is a lookup."""
        return 3 * 2 * self.vocab * self.hidden * tokens

    def train_flops(self, tokens: int, recompute: Literal["none", "full"] = "none") -> int:
        """Training FLOPs of the whole model over `tokens` tokens."""
        return self.layers * self.layer_flops(tokens, recompute) + self.head_flops(tokens)

    # ---- bytes -------------------------------------------------------------------------------------
    def activation_bytes(self, microbatch: int, tp: int = 1, recompute: Literal["none", "full"] = "none",
                         seq: Optional[int] = None,
                         attention: Literal["materialized", "fused"] = "materialized") -> float:
        """Activation bytes one block keeps for backward over a micro-batch of `microbatch` sequences
        (16-bit activations; REFERENCE's estimate, see the module docstring). `attention="fused"`
        drops the 5as/h term (the a x s x s score and probability tensors), which a fused
        (flash-style) attention kernel never stores: benchmarks/activation_memory.py measures a
        block's saved bytes flat in s on such a kernel."""
        s, b, h, a = seq or self.seq, microbatch, self.hidden, self.heads
        if recompute == "full":
            return 2.0 * s * b * h
        scores = 0.0 if attention == "fused" else 5 * a * s / (h * tp)
        return s * b * h * (10 + 24 / tp + scores)

    @staticmethod
    def state_bytes_per_param(zero: int, dp: int) -> float:
        """Weights + gradients + Adam state bytes per parameter (mixed precision) on one rank."""
        if dp < 1:
            raise ModelConfigError("dp", dp, "DP degree must be >= 1")
        table = {0: 16.0, 1: 4 + 12 / dp, 2: 2 + 14 / dp, 3: 16 / dp}
        if zero not in table:
            raise ModelConfigError("zero", zero, f"ZeRO level must be one of {sorted(table)}")
        return table[zero]
