"""Our decoder <-> Hugging Face: a config.json dict to a `ModelConfig` and back, and our parameter names
to the ON-DISK keys of a HF checkpoint (what `save_pretrained` writes into model.safetensors) and back.
Pure functions; no transformers import (a test builds the models with transformers and checks these).

    cfg = config_from_hf(json.load(open("config.json")))    # llama, mistral, qwen2, qwen3, mixtral,
    hf = config_to_hf(cfg)                                   # qwen2_moe, qwen3_moe
    hf_state = to_hf_state(model.state_dict(), cfg); ours = from_hf_state(hf_state, cfg)
    hf_key("blocks.0.attn.wq.weight", cfg) == "model.layers.0.self_attn.q_proj.weight"

Every parameter maps to ONE HF tensor unchanged but for its name: no permutation (HF's Llama-family
checkpoints use the rotate-half rotary layout, which hal.ops.rotary_embedding uses too: the q/k rows
were permuted once by HF's own Meta-to-HF converter), no fusion (transformers 5 fuses MoE experts into
3-D `gate_up_proj` tensors in memory, but `save_pretrained` writes them back per expert, e.g.
`model.layers.0.block_sparse_moe.experts.3.w1.weight` (Mixtral), `model.layers.0.mlp.experts.3.gate_proj.weight`
(Qwen-MoE); tests/test_hf_parity.py reads what a tiny saved model holds). A tied head
(`tie_embeddings`) has no key of its own: `hf_key("head.weight")` is the embedding's key, and
to_hf_state leaves it out, as save_pretrained does.

What a config.json may say that we do not run is refused by its key (HFConfigError, a
ModelConfigError whose field is the HF key): sliding-window attention in use, biases other than
Qwen2's q/k/v biases, a rope type other than "default" / "llama3", partial rotary, dense layers in
a MoE model (`mlp_only_layers`, `decoder_sparse_step`), router jitter, attention dropout, an
activation other than silu. HF's MoE never drops tokens, so `capacity_factor` comes back None.
Older config.json files (transformers 4: `rope_theta` and `rope_scaling` at top level, `torch_dtype`)
and newer ones (transformers 5: `rope_parameters`, `dtype`) are both read; config_to_hf writes both
rope forms so either version loads it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from hal.contract.errors import HalError

from ..errors import ModelConfigError
from .config import ModelConfig, RopeScaling


class HFConfigError(ModelConfigError):
    """A Hugging Face config.json key we cannot map (unsupported feature, missing, wrong value)."""

    kind = "Hugging Face config key"


class HFStateError(HalError, KeyError):
    """A state dict that does not match the config: a name or key we do not know, a missing tensor,
    a wrong shape; the message names it."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Family:
    """How one HF model_type names things and which of our features it has."""

    architecture: str
    moe_prefix: str = ""                        # the MoE module's name inside a layer
    expert_names: tuple = ("gate_proj", "up_proj", "down_proj")   # our w1, w3, w2
    qkv_bias: Optional[bool] = False            # None: the `qkv_bias` key says (default True)
    qk_norm: bool = False
    shared: bool = False                        # Qwen2-MoE's gated shared expert
    norm_topk_default: Optional[bool] = None    # None: always renormalised (no key)
    rope_theta: float = 10000.0
    eps: float = 1e-6


FAMILIES: dict[str, Family] = {
    "llama": Family("LlamaForCausalLM"),
    "mistral": Family("MistralForCausalLM", eps=1e-6),
    "qwen2": Family("Qwen2ForCausalLM", qkv_bias=True),
    "qwen3": Family("Qwen3ForCausalLM", qk_norm=True),
    "mixtral": Family("MixtralForCausalLM", moe_prefix="block_sparse_moe", expert_names=("w1", "w3", "w2"),
                      rope_theta=1e6, eps=1e-5),
    "qwen2_moe": Family("Qwen2MoeForCausalLM", moe_prefix="mlp", qkv_bias=None, shared=True,
                        norm_topk_default=False),
    "qwen3_moe": Family("Qwen3MoeForCausalLM", moe_prefix="mlp", qk_norm=True, norm_topk_default=False),
}
DENSE_NAMES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
ATTN_NAMES = {"wq": "q_proj", "wk": "k_proj", "wv": "v_proj", "wo": "o_proj", "q_norm": "q_norm", "k_norm": "k_norm"}


# ---- config.json -> ModelConfig -------------------------------------------------------------------
def _get(hf: Mapping[str, Any], key: str) -> Any:
    if hf.get(key) is None:
        raise HFConfigError(key, None, f"required for model_type {hf.get('model_type')!r} but missing")
    return hf[key]


def _refuse(hf: Mapping[str, Any], key: str, ok, why: str) -> None:
    """HFConfigError on `key` when its value (if present) fails `ok`."""
    if key in hf and not ok(hf[key]):
        raise HFConfigError(key, hf[key], f"not supported: {why}")


def _rope(hf: Mapping[str, Any], fam: Family, seq: int) -> tuple[float, Optional[RopeScaling]]:
    """(rope_theta, rope_scaling) from `rope_parameters` (transformers 5) or `rope_theta` +
    `rope_scaling` (transformers 4)."""
    key = "rope_parameters" if hf.get("rope_parameters") else "rope_scaling"
    params = dict(hf.get(key) or {})
    if params and all(isinstance(v, dict) for v in params.values()):
        raise HFConfigError(key, params, "not supported: rotary parameters per layer type")
    theta = float(params.get("rope_theta", hf.get("rope_theta") or fam.rope_theta))
    kind = params.get("rope_type", params.get("type", "default"))
    partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise HFConfigError("partial_rotary_factor", partial, "not supported: rotary over part of each head")
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise HFConfigError(f"{key}.rope_type", kind, "not supported: only 'default' and 'llama3' rotary "
                            "scaling are implemented")
    try:
        scaling = RopeScaling(factor=params["factor"], low_freq_factor=params["low_freq_factor"],
                              high_freq_factor=params["high_freq_factor"],
                              original_max_position=params.get("original_max_position_embeddings", seq))
    except KeyError as exc:
        raise HFConfigError(f"{key}.{exc.args[0]}", None, "required for rope_type 'llama3' but missing") from None
    return theta, scaling


def _check_unsupported(hf: Mapping[str, Any], fam: Family, seq: int) -> None:
    """Refuse, by key, what the config asks for that our decoder does not run."""
    _refuse(hf, "hidden_act", lambda v: v == "silu", "only the SwiGLU MLP (silu) is implemented")
    if fam.qkv_bias is False:  # Llama/Mistral/Qwen3/Mixtral: attention_bias also biases o_proj
        _refuse(hf, "attention_bias", lambda v: not v, "biases on q/k/v/o (only Qwen2's q/k/v biases are)")
    _refuse(hf, "mlp_bias", lambda v: not v, "biases on the MLP")
    _refuse(hf, "attention_dropout", lambda v: not v, "dropout is not implemented")
    _refuse(hf, "use_sliding_window", lambda v: not v, "sliding-window attention")
    if "use_sliding_window" not in hf:  # Mistral/Mixtral: the window itself says whether it is used
        _refuse(hf, "sliding_window", lambda v: v is None or v >= seq,
                f"sliding-window attention (a window below max_position_embeddings = {seq})")
    _refuse(hf, "layer_types", lambda v: all(t == "full_attention" for t in v), "layers other than full attention")
    _refuse(hf, "mlp_only_layers", lambda v: not v, "dense layers inside a MoE model")
    _refuse(hf, "decoder_sparse_step", lambda v: v == 1, "MoE on every n-th layer only")
    _refuse(hf, "router_jitter_noise", lambda v: not v, "router jitter noise")
    _refuse(hf, "tie_word_embeddings", lambda v: isinstance(v, bool), "must be true or false")


def _moe_fields(hf: Mapping[str, Any], fam: Family) -> dict[str, Any]:
    """The MoE fields of a mixtral / qwen2_moe / qwen3_moe config."""
    experts_key = "num_local_experts" if "num_local_experts" in hf else "num_experts"
    out: dict[str, Any] = {"experts": int(_get(hf, experts_key)), "top_k": int(_get(hf, "num_experts_per_tok")),
                           "capacity_factor": None,
                           "moe_aux_loss_coef": float(hf.get("router_aux_loss_coef", 0.001))}
    out["ffn"] = int(_get(hf, "intermediate_size" if fam.norm_topk_default is None else "moe_intermediate_size"))
    norm = True if fam.norm_topk_default is None else bool(hf.get("norm_topk_prob", fam.norm_topk_default))
    if norm and out["top_k"] == 1:
        raise HFConfigError("num_experts_per_tok", 1, "not supported with renormalised gates (each gate would "
                            "be 1; our MoE keeps the raw probability at top_k = 1)")
    out["norm_topk_prob"] = norm
    if fam.shared:
        width = int(_get(hf, "shared_expert_intermediate_size"))
        if width < 1:
            raise HFConfigError("shared_expert_intermediate_size", width, "not supported: a Qwen2-MoE layer "
                                "without its shared expert")
        out.update(shared_experts=1, shared_ffn=width, shared_expert_gate=True)
    return out


def config_from_hf(hf: Mapping[str, Any], name: Optional[str] = None) -> ModelConfig:
    """The ModelConfig of a HF config.json dict (model_type one of FAMILIES); `seq` is
    max_position_embeddings. HFConfigError names the key of anything we cannot run."""
    kind = hf.get("model_type")
    if kind not in FAMILIES:
        raise HFConfigError("model_type", kind, f"not supported; supported: {sorted(FAMILIES)}")
    fam = FAMILIES[kind]
    seq = int(_get(hf, "max_position_embeddings"))
    _check_unsupported(hf, fam, seq)
    theta, scaling = _rope(hf, fam, seq)
    fields: dict[str, Any] = dict(
        name=name or str(hf.get("_name_or_path") or kind).rstrip("/").split("/")[-1] or kind,
        layers=int(_get(hf, "num_hidden_layers")), hidden=int(_get(hf, "hidden_size")),
        heads=int(_get(hf, "num_attention_heads")), vocab=int(_get(hf, "vocab_size")), seq=seq,
        kv_heads=hf.get("num_key_value_heads"), head_dim=hf.get("head_dim"),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=bool(hf.get("qkv_bias", True)) if fam.qkv_bias is None else fam.qkv_bias,
        qk_norm=fam.qk_norm, rope_theta=theta, rope_scaling=scaling,
        norm_eps=float(hf.get("rms_norm_eps", fam.eps)))
    if fam.moe_prefix:
        fields.update(_moe_fields(hf, fam))
    else:
        fields["ffn"] = int(_get(hf, "intermediate_size"))
    try:
        return ModelConfig(**fields)
    except ModelConfigError as exc:
        raise HFConfigError(exc.field, exc.value, f"{exc.problem} (our field {exc.field!r}, from {kind} "
                            f"config.json)") from None


# ---- ModelConfig -> config.json -------------------------------------------------------------------
def hf_model_type(cfg: ModelConfig) -> str:
    """The HF model_type that holds `cfg` exactly; HFConfigError naming our field when none does."""
    def no(field: str, why: str):
        return HFConfigError(field, getattr(cfg, field), f"no supported Hugging Face family has this {why}")
    if cfg.windowed_layers():
        raise no("sliding_window", "(sliding-window attention is not exported)")
    if cfg.is_moe:
        if cfg.shared_experts:
            if not cfg.shared_expert_gate:
                raise no("shared_expert_gate", "(ungated shared experts: DeepSeek-V2/V3 also need MLA and "
                                               "grouped routing)")
            if cfg.qk_norm:
                raise no("qk_norm", "combination (shared experts with q/k norm)")
            return "qwen2_moe"
        if cfg.qk_norm:
            if cfg.qkv_bias:
                raise no("qkv_bias", "combination (q/k/v biases with q/k norm)")
            return "qwen3_moe"
        if cfg.qkv_bias or not cfg.norm_topk_prob:
            raise no("qkv_bias" if cfg.qkv_bias else "norm_topk_prob", "combination without shared experts "
                     "or q/k norm (Mixtral: no biases, renormalised gates)")
        return "mixtral"
    if cfg.qk_norm:
        if cfg.qkv_bias:
            raise no("qkv_bias", "combination (q/k/v biases with q/k norm)")
        return "qwen3"
    return "qwen2" if cfg.qkv_bias else "llama"


def config_to_hf(cfg: ModelConfig, dtype: str = "float32") -> dict[str, Any]:
    """A config.json dict `transformers` loads (AutoConfig / AutoModelForCausalLM) for `cfg`."""
    kind = hf_model_type(cfg)
    fam = FAMILIES[kind]
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling is not None:
        r = cfg.rope_scaling
        rope.update(rope_type=r.type, factor=r.factor, low_freq_factor=r.low_freq_factor,
                    high_freq_factor=r.high_freq_factor, original_max_position_embeddings=r.original_max_position)
    out: dict[str, Any] = {
        "architectures": [fam.architecture], "model_type": kind, "torch_dtype": dtype,
        "vocab_size": cfg.vocab, "hidden_size": cfg.hidden, "num_hidden_layers": cfg.layers,
        "num_attention_heads": cfg.heads, "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
        "intermediate_size": cfg.ffn, "max_position_embeddings": cfg.seq, "rms_norm_eps": cfg.norm_eps,
        "hidden_act": "silu", "tie_word_embeddings": cfg.tie_embeddings, "attention_dropout": 0.0,
        "rope_parameters": rope, "rope_theta": cfg.rope_theta,
        "rope_scaling": None if cfg.rope_scaling is None else dict(rope),
    }
    if fam.qkv_bias is False:
        out["attention_bias"] = False
    if kind.startswith("qwen"):
        out.update(use_sliding_window=False, sliding_window=None)
    if cfg.is_moe:
        out.update(num_experts_per_tok=cfg.top_k, router_aux_loss_coef=cfg.moe_aux_loss_coef,
                   output_router_logits=False)
        if kind == "mixtral":
            out.update(num_local_experts=cfg.experts, router_jitter_noise=0.0)
        else:
            out.update(num_experts=cfg.experts, moe_intermediate_size=cfg.ffn, norm_topk_prob=cfg.norm_topk_prob,
                       decoder_sparse_step=1, mlp_only_layers=[])
        if kind == "qwen2_moe":
            out.update(shared_expert_intermediate_size=cfg.shared_ffn, qkv_bias=cfg.qkv_bias)
    return out


# ---- parameter names ------------------------------------------------------------------------------
_TOP = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
        "head.weight": "lm_head.weight"}
_BLOCK = re.compile(r"blocks\.(\d+)\.(.+)")


def _block_key(rest: str, fam: Family) -> Optional[str]:
    """The HF name (after `model.layers.<i>.`) of our block parameter `rest`, or None."""
    parts = rest.split(".")
    if rest in ("attn_norm.weight", "ffn_norm.weight"):
        return "input_layernorm.weight" if parts[0] == "attn_norm" else "post_attention_layernorm.weight"
    if parts[0] == "attn" and len(parts) == 3 and parts[1] in ATTN_NAMES:
        return f"self_attn.{ATTN_NAMES[parts[1]]}.{parts[2]}"
    if parts[0] == "mlp" and len(parts) == 3 and parts[1] in DENSE_NAMES and not fam.moe_prefix:
        return f"mlp.{DENSE_NAMES[parts[1]]}.{parts[2]}"
    if parts[0] != "moe" or not fam.moe_prefix:
        return None
    p = fam.moe_prefix
    expert = dict(zip(("w1", "w3", "w2"), fam.expert_names))
    if rest == "moe.router.weight":
        return f"{p}.gate.weight"
    if len(parts) == 5 and parts[1] == "experts" and parts[2].isdigit() and parts[3] in expert:
        return f"{p}.experts.{parts[2]}.{expert[parts[3]]}.{parts[4]}"
    if fam.shared and len(parts) == 4 and parts[1] == "shared" and parts[2] in DENSE_NAMES:
        return f"{p}.shared_expert.{DENSE_NAMES[parts[2]]}.{parts[3]}"
    if fam.shared and rest == "moe.shared_gate.weight":
        return f"{p}.shared_expert_gate.weight"
    return None


def hf_key(name: str, cfg: ModelConfig) -> str:
    """The on-disk HF key of our parameter `name` (the full model's name, e.g. 'blocks.3.moe.experts.5.w1.weight');
    a tied head's is the embedding's. HFStateError for a name the config's model does not have."""
    fam = FAMILIES[hf_model_type(cfg)]
    if name == "head.weight" and cfg.tie_embeddings:
        return _TOP["embed.weight"]
    key: Optional[str] = _TOP.get(name)
    m = _BLOCK.fullmatch(name)
    if m and int(m.group(1)) < cfg.layers:
        sub = _block_key(m.group(2), fam)
        key = f"model.layers.{m.group(1)}.{sub}" if sub else None
    if key is None or name not in param_shapes(cfg):
        raise HFStateError(f"hf_key: {name!r} is not a parameter of model {cfg.name!r} "
                           f"({hf_model_type(cfg)} layout)")
    return key


_SHAPES: dict[ModelConfig, dict[str, tuple[int, ...]]] = {}


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Our parameter names (GPT's state_dict keys, a tied head included) and full shapes, read off the
    GPT itself built on the meta device (no storage), so the names have one definition."""
    if cfg not in _SHAPES:
        import torch

        from .gpt import GPT
        with torch.device("meta"):
            model = GPT(cfg)
        _SHAPES[cfg] = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    return _SHAPES[cfg]


def _check_shape(name: str, key: str, tensor: Any, want: tuple[int, ...]) -> None:
    got = tuple(tensor.shape)
    if got != want:
        raise HFStateError(f"{key} (our {name}): shape {got}, but the config wants {want}")


def to_hf_state(our_state: Mapping[str, Any], cfg: ModelConfig, strict: bool = True) -> dict[str, Any]:
    """Our state dict (full model names and shapes) -> the HF checkpoint's keys, tensors unchanged.
    A tied head is left out (save_pretrained writes the embedding only). strict: every parameter present."""
    shapes = param_shapes(cfg)
    out: dict[str, Any] = {}
    for name, t in our_state.items():
        key = hf_key(name, cfg)
        _check_shape(name, key, t, shapes[name])
        if name == "head.weight" and cfg.tie_embeddings:
            continue
        out[key] = t
    missing = [n for n in shapes if n not in our_state and not (n == "head.weight" and cfg.tie_embeddings)]
    if strict and missing:
        raise HFStateError(f"to_hf_state: {len(missing)} parameters of model {cfg.name!r} missing, e.g. {missing[:3]}")
    return out


def from_hf_state(hf_state: Mapping[str, Any], cfg: ModelConfig, strict: bool = True) -> dict[str, Any]:
    """A HF checkpoint's tensors (on-disk keys) -> our state dict (a tied head gets the embedding's
    tensor, so `GPT.load_state_dict` takes it). strict: no missing and no unknown key."""
    shapes = param_shapes(cfg)
    wanted = {}
    for name in shapes:
        wanted.setdefault(hf_key(name, cfg), []).append(name)
    unknown = sorted(k for k in hf_state if k not in wanted)
    missing = sorted(k for k in wanted if k not in hf_state)
    if strict and (unknown or missing):
        raise HFStateError(f"from_hf_state ({hf_model_type(cfg)} layout of {cfg.name!r}): "
                           f"{len(missing)} keys missing {missing[:3]}, {len(unknown)} unknown {unknown[:3]}")
    out: dict[str, Any] = {}
    for key, names in wanted.items():
        if key in hf_state:
            for name in names:
                _check_shape(name, key, hf_state[key], shapes[name])
                out[name] = hf_state[key]
    return out
