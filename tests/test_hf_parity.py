"""Logits parity with `transformers` itself: for each family (Llama with GQA and llama3 rope scaling,
tied and untied; Qwen2 with q/k/v biases; Qwen3 with q/k norm and an explicit head_dim; Mixtral 8
experts top-2; Qwen2-MoE with its gated shared expert; Qwen3-MoE) a tiny random model is built with
transformers (config made here, no download), saved with save_pretrained, read back from disk
(config.json + model.safetensors), mapped with hal.strategies.models.hf_map into our GPT, and the
float32 logits compared; then our state is mapped back and must equal the file's tensors exactly, and
transformers must load our config_to_hf config.json with the same weights and give the same logits.
In-process, one module.

Tolerance: max |ours - HF| <= 2e-5 x max(1, max |HF logit|). Both sides are float32 with the same
weights; they differ only in the order of floating-point operations (our rotary tables in float64
then rounded vs HF's float32, the MoE's concatenated gate/up matmul, SDPA vs HF's attention path,
index_add order of expert outputs). With float32's 1.2e-7 relative rounding over 2 layers of sums of
at most a few hundred terms, that order leaves differences of order 1e-6 of the logit scale
(measured on this CPU: 0.65e-6 .. 1.15e-6 over the seven cases, logit scale 4.2 .. 5.5); a wrong
mapping changes logits at order 1e-1 (measured: dropping the llama3 rope scaling 1.19, dropping
Qwen2's q/k/v biases 0.50), four orders above the bound.
"""
import json

import pytest
import torch

import hal
from hal.strategies.models import GPT
from hal.strategies.models.gpt import rotary_tables
from hal.strategies.models.hf_map import (HFConfigError, HFStateError, config_from_hf, config_to_hf, from_hf_state,
                                          hf_key, to_hf_state)

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

TOL = 2e-5
COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=32)
LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8}
MOE = dict(num_experts_per_tok=2, moe_intermediate_size=24)
CASES = {
    "llama-gqa-llama3-rope": ("LlamaConfig", dict(COMMON, rope_parameters=LLAMA3)),
    "llama-tied-mqa": ("LlamaConfig", dict(COMMON, num_key_value_heads=1, tie_word_embeddings=True)),
    "qwen2-qkv-bias": ("Qwen2Config", dict(COMMON)),
    "qwen3-qk-norm-head-dim": ("Qwen3Config", dict(COMMON, head_dim=24)),
    "mixtral-8x-top2": ("MixtralConfig", dict(COMMON, num_local_experts=8, num_experts_per_tok=2)),
    "qwen2-moe-shared": ("Qwen2MoeConfig", dict(COMMON, num_experts=4, shared_expert_intermediate_size=40, **MOE)),
    "qwen3-moe": ("Qwen3MoeConfig", dict(COMMON, num_experts=4, norm_topk_prob=True, **MOE)),
}


def _hf_model(cls_name, kwargs):
    """A transformers model of random weights: every parameter drawn (biases and norm gains too, so a
    dropped or misplaced one shows), float32, eval."""
    torch.manual_seed(0)
    cfg = getattr(transformers, cls_name)(**kwargs)
    model = transformers.AutoModelForCausalLM.from_config(cfg).float().eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if name.endswith("norm.weight") else 0.0
            p.copy_(base + torch.randn(p.shape, generator=g) * (0.3 if base else 0.15))
    return model


@pytest.fixture(scope="module", params=list(CASES))
def saved(request, tmp_path_factory):
    hal.accelerator()
    cls_name, kwargs = CASES[request.param]
    model = _hf_model(cls_name, kwargs)
    out = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(out)
    ids = torch.randint(0, kwargs["vocab_size"], (2, kwargs["max_position_embeddings"]),
                        generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = model(ids).logits
    return request.param, out, ids, ref


def _ours(out):
    hf_cfg = json.loads((out / "config.json").read_text())
    cfg = config_from_hf(hf_cfg)
    disk = safetensors_torch.load_file(out / "model.safetensors")
    model = GPT(cfg)
    model.load_state_dict(from_hf_state(disk, cfg))
    return cfg, disk, model.eval()


def test_logits_match_transformers(saved):
    case, out, ids, ref = saved
    cfg, _, model = _ours(out)
    with torch.no_grad():
        ours = model(ids)
    scale = max(1.0, ref.abs().max().item())
    err = (ours - ref).abs().max().item() / scale
    assert err <= TOL, f"{case}: max |ours - HF| / scale = {err:.3g} (scale {scale:.3g}) > {TOL}"
    assert ref.std() > 0.1  # the logits are not flat: the comparison means something


def test_state_maps_back_exactly_and_transformers_loads_our_config(saved):
    case, out, ids, ref = saved
    cfg, disk, model = _ours(out)
    back = to_hf_state(model.state_dict(), cfg)
    assert set(back) == set(disk), f"{case}: {sorted(set(back) ^ set(disk))}"
    assert all(torch.equal(back[k], disk[k]) for k in disk)
    assert config_from_hf(config_to_hf(cfg)) == cfg
    (out / "config.json").write_text(json.dumps(config_to_hf(cfg)))
    again = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        assert torch.equal(again(ids).logits, ref), f"{case}: transformers on our config.json differs"


def test_names_features_and_refusals():
    hal.accelerator()
    mix = config_from_hf(dict(model_type="mixtral", num_local_experts=8, num_experts_per_tok=2, **COMMON))
    assert (mix.experts, mix.kv_heads, mix.capacity_factor, mix.rope_theta) == (8, 2, None, 1e6)
    assert hf_key("blocks.0.moe.experts.3.w1.weight", mix) == "model.layers.0.block_sparse_moe.experts.3.w1.weight"
    qmoe = config_from_hf(dict(model_type="qwen2_moe", num_experts=4, shared_expert_intermediate_size=40,
                               **MOE, **COMMON))
    assert hf_key("blocks.1.moe.experts.3.w1.weight", qmoe) == "model.layers.1.mlp.experts.3.gate_proj.weight"
    assert hf_key("blocks.1.moe.shared_gate.weight", qmoe) == "model.layers.1.mlp.shared_expert_gate.weight"
    assert (qmoe.shared_ffn, qmoe.shared_expert_gate, qmoe.norm_topk_prob, qmoe.qkv_bias) == (40, True, False, True)
    tied = config_from_hf(dict(model_type="llama", tie_word_embeddings=True, **COMMON))
    assert hf_key("head.weight", tied) == "model.embed_tokens.weight"
    with pytest.raises(HFStateError, match="blocks.2.attn.wq.weight"):
        hf_key("blocks.2.attn.wq.weight", tied)
    # llama3 scaling changes the rotary tables (so the llama case above tests it)
    scaled = config_from_hf(dict(model_type="llama", rope_parameters=dict(LLAMA3), **COMMON))
    assert not torch.allclose(rotary_tables(32, 16, 1e4, scaled.rope_scaling)[0], rotary_tables(32, 16, 1e4)[0])
    refusals = [("sliding_window", dict(model_type="mistral", sliding_window=16)),
                ("use_sliding_window", dict(model_type="qwen2", use_sliding_window=True, sliding_window=8)),
                ("attention_bias", dict(model_type="llama", attention_bias=True)),
                ("rope_parameters.rope_type", dict(model_type="llama", rope_parameters={"rope_type": "yarn"})),
                ("mlp_only_layers", dict(model_type="qwen3_moe", num_experts=4, mlp_only_layers=[1], **MOE)),
                ("model_type", dict(model_type="gpt2")),
                ("kv_heads", dict(model_type="llama", num_key_value_heads=3)),
                ("vocab_size", dict(model_type="llama", vocab_size=None))]
    for key, extra in refusals:
        with pytest.raises(HFConfigError) as info:
            config_from_hf({**COMMON, **extra})
        assert info.value.field == key, str(info.value)
    with pytest.raises(HFConfigError, match="shared_expert_gate"):
        config_to_hf(qmoe.model_copy(update={"shared_expert_gate": False}))
