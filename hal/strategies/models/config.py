"""`ModelConfig`: the sizes of a GPT-style decoder (dense or MoE) covering the Llama, Qwen2, Qwen3,
Mixtral and Qwen-MoE / DeepSeek-MoE families, and the per-layer parameter, FLOP and byte counts the
planner prices a layout with, all from the same numbers. (`hf_map.py` maps it to and from a Hugging
Face config.json; docs/strategies.md has the field table.)

Counts (h = hidden, f = ffn, s = seq, a = heads, g = kv_heads, d = head_dim, q = a d, c = g d,
V = vocab, E = experts, k = top_k, F = shared_ffn):
- parameters of a dense block: attention 2hq + 2hc (wq, wk, wv, wo) [+ q + 2c with qkv_bias]
  [+ 2d with qk_norm] + SwiGLU MLP 3hf (w1, w3, w2) + 2h (two RMSNorm gains). Without GQA and with
  d = h/a the attention is 4h^2, and with f = 8h/3 (the SwiGLU width of Llama) 4h^2 + 3hf = 12h^2,
  the "12 L h^2" of REFERENCE.md. A MoE block has E experts of 3hf each, a router of hE and, with
  shared experts, one shared SwiGLU path 3hF [+ h for its sigmoid gate] instead of the MLP.
  Embedding Vh; head Vh + its norm h, or only the norm h when tie_embeddings (the head is the
  embedding matrix).
- training FLOPs per token of a block, forward + backward = 3 x forward, forward = 2 x (weights a
  token meets: 2hq + 2hc + 3hf, or 2hq + 2hc + k 3hf + hE [+ 3hF + h] for MoE) + 4sq (QK^T and AV
  over the full sequence, as Megatron counts it; GQA shares K/V but every query head still attends).
  So a dense MHA block is 6 x params x token plus 12sh, and with f = 8h/3 it is 72h^2 + 12sh:
  REFERENCE's 72 B s L h^2 (1 + s/(6h)) per layer. Biases, norms and rotary are elementwise and not
  counted. Full recompute adds one forward (4 x forward: REFERENCE's "8 with full recompute"). The
  head costs 6Vh per token, tied or not (it is still a matmul).
- activation bytes per block and micro-batch of b sequences: REFERENCE's estimate (Korthikanti et
  al. 2022, 16-bit activations) s b (10h + (4q + 4c + 16h)/t + 5 a s / t) with TP degree t: the
  attention keeps Q and the projection input (2 bytes x q each) and K, V (2 bytes x c each), which
  is REFERENCE's s b h (10 + 24/t + 5 a s/(h t)) without GQA (q = c = h); qk_norm keeps its two
  inputs as well (+ 2(q + c)/t). With full recompute only the block input is kept, 2 s b h. The MLP
  term is the real MLP's (`mlp_activation_bytes`): Korthikanti's 16h is their GeLU MLP of width 4h
  (the GeLU input and the second GEMM's input, 2 x 4h x 2 bytes); SwiGLU of width f keeps 8f as
  torch's autograd runs it, 6f with a fused SwiGLU kernel (= 16h at f = 8h/3). A MoE layer keeps
  its own term instead, whole on every TP rank (`moe_activation_bytes`: the router's fp32 softmax,
  and per routed copy the expert's input, its SwiGLU and, unfused, its output). The rest (10h) was
  derived with dropout and LayerNorm; here it is an estimate for our RMSNorm blocks, not a measurement.
  `attention="fused"` drops the 5as/h term a flash-style kernel never stores; measured against a
  real block in docs/performance.md (benchmarks/activation_memory.py): within about 1.5x.
- training-state bytes per parameter with mixed-precision Adam (REFERENCE): 16 plain DP; ZeRO-2
  2 + 14/d; ZeRO-3 16/d over a DP group of d.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional, Union

from pydantic import ConfigDict, Field, PrivateAttr, model_serializer, model_validator

from ..errors import FieldErrorModel, ModelConfigError, read_toml


class RopeScaling(FieldErrorModel):
    """Llama 3.1-style rotary frequency scaling (HF `rope_parameters` with rope_type "llama3"): the
    wavelengths longer than original_max_position / low_freq_factor are divided by `factor`, those
    shorter than original_max_position / high_freq_factor are kept, the ones between interpolated."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    field_error = ModelConfigError

    type: Literal["llama3"] = "llama3"
    factor: float = Field(gt=0)
    low_freq_factor: float = Field(gt=0)
    high_freq_factor: float = Field(gt=0)
    original_max_position: int = Field(ge=1)

    @model_validator(mode="after")
    def _bands(self) -> "RopeScaling":
        if self.high_freq_factor <= self.low_freq_factor:
            raise ModelConfigError("high_freq_factor", self.high_freq_factor,
                                   f"must exceed low_freq_factor = {self.low_freq_factor} (the interpolation "
                                   f"divides by their difference)")
        return self


class ModelConfig(FieldErrorModel):
    """Sizes of a decoder-only transformer; experts = 0 means dense. `kv_heads`, `head_dim` and
    `shared_ffn` left out (None) are derived by the validator (heads, hidden // heads,
    shared_experts x ffn), so they read as ints; `model_dump()` gives them back as None so that a
    dump with a changed size (e.g. the trainer's `[model]` overrides) derives them again. A value
    given equal to its default is the default (dumped as None, equal to a config without it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    field_error = ModelConfigError

    name: str = Field(min_length=1)
    layers: int = Field(ge=1, description="decoder blocks")
    hidden: int = Field(ge=1)
    heads: int = Field(ge=1, description="attention (query) heads")
    ffn: int = Field(ge=1, description="SwiGLU width (of each routed expert in a MoE model)")
    vocab: int = Field(ge=2)
    seq: int = Field(ge=1, description="sequence length (positions of the rotary table)")
    kv_heads: Optional[int] = Field(default=None, ge=1,
                                    description="key/value heads (grouped-query attention); None = heads")
    head_dim: Optional[int] = Field(default=None, ge=2,
                                    description="per-head width, even (rotary); None = hidden // heads")
    tie_embeddings: bool = Field(default=False, description="the head uses the embedding matrix")
    qkv_bias: bool = Field(default=False, description="biases on wq, wk, wv (Qwen2)")
    qk_norm: bool = Field(default=False, description="RMSNorm over head_dim on q and k before rotary (Qwen3)")
    rope_scaling: Optional[RopeScaling] = None
    experts: int = Field(default=0, ge=0, description="0 = dense; else routed experts per MoE layer")
    top_k: int = Field(default=2, ge=1)
    norm_topk_prob: bool = Field(default=True, description="renormalise the top-k gates to sum 1 (top_k > 1)")
    shared_experts: int = Field(default=0, ge=0, description="shared experts every token meets (MoE only)")
    shared_ffn: Optional[int] = Field(default=None, ge=1,
                                      description="width of the shared path; None = shared_experts x ffn")
    shared_expert_gate: bool = Field(default=False, description="sigmoid gate on the shared path (Qwen2-MoE)")
    capacity_factor: Optional[float] = Field(default=1.25, description="<= 0 or None: no token dropping")
    moe_aux_loss_coef: float = Field(default=0.01, ge=0)
    rope_theta: float = Field(default=10000.0, gt=0)
    norm_eps: float = Field(default=1e-6, gt=0)
    # sliding-window attention, as HF configs state it (GPT-OSS, Mistral): a costing fact for the planner;
    # hal's own decoder (gpt.py) runs full causal attention and refuses a config that sets a window
    sliding_window: Optional[int] = Field(default=None, ge=1,
                                          description="keys a query sees (itself and the window - 1 before "
                                                      "it) on windowed layers; None = full causal attention")
    layer_types: Optional[tuple[Literal["full_attention", "sliding_attention"], ...]] = Field(
        default=None, description="per layer, HF's names; None with sliding_window = every layer windowed")

    _derived: frozenset = PrivateAttr(default=frozenset())

    @model_validator(mode="after")
    def _sizes(self) -> "ModelConfig":
        derived = set()
        if self.head_dim is not None and self.head_dim * self.heads == self.hidden:
            derived.add("head_dim")  # equal to its default: the default (see _dump)
        if self.head_dim is None:
            if self.hidden % self.heads:
                raise ModelConfigError("hidden", self.hidden, f"not divisible by heads = {self.heads} "
                                       f"({self.hidden} % {self.heads} = {self.hidden % self.heads}); "
                                       f"or give head_dim")
            if (self.hidden // self.heads) % 2:
                raise ModelConfigError("hidden", self.hidden, f"head dim hidden / heads = {self.hidden} / "
                                       f"{self.heads} = {self.hidden // self.heads} is odd; rotary embedding "
                                       f"rotates pairs, so it must be even")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
            derived.add("head_dim")
        elif self.head_dim % 2:
            raise ModelConfigError("head_dim", self.head_dim, "is odd; rotary embedding rotates pairs, so it "
                                   "must be even")
        if self.kv_heads is None or self.kv_heads == self.heads:
            object.__setattr__(self, "kv_heads", self.heads)
            derived.add("kv_heads")
        elif self.heads % self.kv_heads:
            raise ModelConfigError("kv_heads", self.kv_heads, f"does not divide heads = {self.heads} "
                                   f"({self.heads} % {self.kv_heads} = {self.heads % self.kv_heads}); each K/V "
                                   f"head serves heads / kv_heads query heads")
        self._check_moe(derived)
        self._check_window()
        self._derived = frozenset(derived)
        return self

    def _check_window(self) -> None:
        if self.layer_types is None:
            return
        if len(self.layer_types) != self.layers:
            raise ModelConfigError("layer_types", list(self.layer_types), f"has {len(self.layer_types)} entries "
                                   f"for layers = {self.layers} (one per layer)")
        if "sliding_attention" in self.layer_types and self.sliding_window is None:
            raise ModelConfigError("layer_types", list(self.layer_types), "names sliding_attention layers but "
                                   "sliding_window is not set")

    def windowed_layers(self) -> int:
        """How many layers attend through the sliding window (0 without one)."""
        if self.sliding_window is None:
            return 0
        return self.layers if self.layer_types is None else self.layer_types.count("sliding_attention")

    def _check_moe(self, derived: set) -> None:
        if self.experts and self.top_k > self.experts:
            raise ModelConfigError("top_k", self.top_k, f"exceeds experts = {self.experts}")
        if self.shared_experts and not self.experts:
            raise ModelConfigError("shared_experts", self.shared_experts, "needs a MoE model (experts > 0)")
        if not self.shared_experts:
            for name in ("shared_ffn", "shared_expert_gate"):
                if getattr(self, name):
                    raise ModelConfigError(name, getattr(self, name), "is set but shared_experts = 0")
        elif self.shared_ffn is None or self.shared_ffn == self.shared_experts * self.ffn:
            object.__setattr__(self, "shared_ffn", self.shared_experts * self.ffn)
            derived.add("shared_ffn")

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        """Derived fields dump as None (see the class docstring)."""
        data = handler(self)
        if isinstance(data, dict):
            for name in self._derived:
                data[name] = None
        return data

    @classmethod
    def from_toml(cls, path: Union[str, Path]) -> "ModelConfig":
        """Read a config file: its fields at top level (or under a `[model]` table)."""
        data = read_toml(path, ModelConfigError, "model config")
        if isinstance(data.get("model"), dict):
            data = data["model"]
        return cls(**data)

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def q_dim(self) -> int:
        """Width of the query projection, heads x head_dim (= hidden without an explicit head_dim)."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of each of the key and value projections, kv_heads x head_dim."""
        return self.kv_heads * self.head_dim

    # ---- parameters ------------------------------------------------------------------------------
    def attention_params(self) -> int:
        """wq, wk, wv, wo (+ q/k/v biases, + the q/k norm gains) of one block."""
        h, q, c = self.hidden, self.q_dim, self.kv_dim
        return 2 * h * q + 2 * h * c + (q + 2 * c if self.qkv_bias else 0) + (2 * self.head_dim if self.qk_norm else 0)

    def shared_params(self) -> int:
        """The shared expert path of one MoE block (0 without shared experts)."""
        if not self.shared_experts:
            return 0
        return 3 * self.hidden * self.shared_ffn + (self.hidden if self.shared_expert_gate else 0)

    def layer_params(self) -> int:
        """Parameters of one decoder block (see the module docstring)."""
        h, f = self.hidden, self.ffn
        ffn = self.experts * 3 * h * f + h * self.experts + self.shared_params() if self.is_moe else 3 * h * f
        return self.attention_params() + ffn + 2 * h

    def embed_params(self) -> int:
        return self.vocab * self.hidden

    def head_params(self) -> int:
        """Final norm and output projection (only the norm when the head is tied to the embedding)."""
        return (0 if self.tie_embeddings else self.vocab * self.hidden) + self.hidden

    def num_params(self) -> int:
        return self.embed_params() + self.layers * self.layer_params() + self.head_params()

    def active_params(self) -> int:
        """Parameters one token meets: a MoE block's top_k experts (and router, shared path) only."""
        if not self.is_moe:
            return self.num_params()
        inactive = (self.experts - self.top_k) * 3 * self.hidden * self.ffn
        return self.num_params() - self.layers * inactive

    def layer_param_bytes(self, bytes_per_param: int = 2) -> int:
        """Bytes of one block's weights (2: bf16/fp16 weights)."""
        return self.layer_params() * bytes_per_param

    # ---- FLOPs -----------------------------------------------------------------------------------
    def layer_forward_flops(self, tokens: int, seq: Optional[int] = None) -> int:
        """Forward FLOPs of one block over `tokens` tokens in sequences of `seq` (default cfg.seq)."""
        h, f, s = self.hidden, self.ffn, seq or self.seq
        ffn = (self.top_k * 3 * h * f + h * self.experts + self.shared_params()) if self.is_moe else 3 * h * f
        attn = 2 * h * self.q_dim + 2 * h * self.kv_dim
        return tokens * (2 * (attn + ffn) + 4 * s * self.q_dim)

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
                         attention: Literal["materialized", "fused"] = "materialized",
                         fused_swiglu: bool = False) -> float:
        """Activation bytes one block keeps for backward over a micro-batch of `microbatch` sequences
        (16-bit activations; REFERENCE's estimate with the real MLP, see the module docstring).
        `attention="fused"` drops the 5as/h term (the a x s x s score and probability tensors), which
        a fused (flash-style) attention kernel never stores: benchmarks/activation_memory.py measures
        a block's saved bytes flat in s on such a kernel. `fused_swiglu`: see `mlp_activation_bytes`."""
        s, b, h, a = seq or self.seq, microbatch, self.hidden, self.heads
        if recompute == "full":
            return 2.0 * s * b * h
        q, c = self.q_dim, self.kv_dim
        sharded = 4 * q + 4 * c + self.mlp_activation_bytes(fused_swiglu) + (2 * (q + c) if self.qk_norm else 0)
        scores = 0.0 if attention == "fused" else 5 * a * s
        return s * b * (10 * h + self.moe_activation_bytes(fused_swiglu) + (sharded + scores) / tp)

    def mlp_activation_bytes(self, fused_swiglu: bool = False) -> float:
        """Bytes per token (16-bit) one block's MLP keeps for backward beyond its input (which the 10h
        of `activation_bytes` counts), all sharded over TP. Korthikanti et al. 2022 (arXiv 2205.05198)
        section 4.1 count a GeLU MLP of width 4h: the GeLU input and the second GEMM's input, 8h + 8h
        = 16h (their dropout mask is in the 10h). SwiGLU w2(silu(w1 x) * w3 x) of width f: torch's
        autograd keeps silu's input (w1 x), the product's two operands (silu(w1 x), w3 x) and w2's
        input (the product): 4 x 2f = 8f (apply_plan's blocks, hal.strategies.models.gpt.MLP); a fused
        kernel that keeps only its input (w1 x | w3 x) and recomputes silu in backward (Megatron-Core's
        BiasSwiGLUFunction, megatron/core/fusions/fused_bias_swiglu.py: save_for_backward(input))
        keeps 2 x 2f + 2f = 6f, which at Megatron's GPT width f = 8h/3 is the GeLU MLP's 16h."""
        if self.is_moe:
            return 0.0       # the MoE layer is not sharded over TP: `moe_activation_bytes`, counted whole
        return (6.0 if fused_swiglu else 8.0) * self.ffn

    def moe_activation_bytes(self, fused_swiglu: bool = False) -> float:
        """Bytes per token one MoE layer keeps for backward beyond its input (0 for a dense model), NOT
        sharded over TP: apply_plan's TP replicates the MoE layer (tensor_parallel.block_plan) and the
        published MoE runs use expert TP 1. Korthikanti et al.'s accounting (every tensor a backward
        reads, 2 bytes an element) applied to the routed layer (hal.strategies.moe; Megatron-Core's
        MoELayer with the alltoall dispatcher and grouped experts):
          - the router's fp32 softmax output, kept for its backward: 4E;
          - each of the k routed copies of the token: the expert's input row (its first GEMM's weight
            gradient) 2h, the expert's SwiGLU as `mlp_activation_bytes` counts it on the expert ffn f
            (8f eager, 6f fused), and the expert's output row 2h, which apply_plan multiplies by the
            gate after the expert (`back * gates`: the product keeps it for the gate's gradient); the
            fused kernels (Megatron-Core's weighted_bias_swiglu / weighted_bias_quick_geglu,
            megatron/core/transformer/moe/experts.py at b0cc2706dd, l. 680-705) apply the gate inside
            the activation and keep only its input, so no output row;
          - the shared path (shared_ffn F): its SwiGLU, 8F or 6F (its input is the layer's)."""
        return sum(self.moe_activation_parts(fused_swiglu).values())

    def moe_activation_parts(self, fused_swiglu: bool = False) -> dict[str, float]:
        """`moe_activation_bytes` by part (bytes per token): "router" (4E), "rows" (the routed copies'
        input and, unfused, output rows: what the dispatch's permute / un-permute passes move), "swiglu"
        (the experts' SwiGLU on the k copies and the shared path's). Empty for a dense model."""
        if not self.is_moe:
            return {}
        h, f, k = self.hidden, self.ffn, self.top_k
        swiglu = 6.0 if fused_swiglu else 8.0
        shared = swiglu * self.shared_ffn if self.shared_experts else 0.0
        return {"router": 4.0 * self.experts, "rows": k * (2.0 * h + (0.0 if fused_swiglu else 2.0 * h)),
                "swiglu": k * swiglu * f + shared}

    @staticmethod
    def state_bytes_per_param(zero: int, dp: int) -> float:
        """Weights + gradients + Adam state bytes per parameter (mixed precision) on one rank."""
        if dp < 1:
            raise ModelConfigError("dp", dp, "DP degree must be >= 1")
        table = {0: 16.0, 1: 4 + 12 / dp, 2: 2 + 14 / dp, 3: 16 / dp}
        if zero not in table:
            raise ModelConfigError("zero", zero, f"ZeRO level must be one of {sorted(table)}")
        return table[zero]
