"""hal.strategies.models: ModelConfig validation and files, the GPT (names the strategies shard by, every op
through hal.ops, causal, rotary, deterministic init, dense and MoE), the per-layer counts against
REFERENCE.md's formulas, the families' fields (GQA, head_dim, biases, q/k norm, rope scaling, tied head,
shared experts: validation, counts, TP's K/V-head check, EP leaving shared experts dense) and the example
configs' counts against the published model sizes. Single process."""
from pathlib import Path

import pytest
import torch

import hal
import hal.ops
from hal.strategies.errors import ModelConfigError
from hal.strategies.models import GPT, ModelConfig, build_model, count_tokens, lm_loss, lm_loss_sum, make_batches
from hal.strategies.models.gpt import rotary_tables

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "models"
TINY = dict(name="t", layers=2, hidden=32, heads=4, ffn=64, vocab=64, seq=16)


def bad(field, value, *words, **changes):
    with pytest.raises(ModelConfigError) as info:
        ModelConfig(**{**TINY, **changes})
    err = info.value
    assert (err.field, err.value) == (field, value), str(err)
    for w in words:
        assert w in str(err), str(err)


def test_config_rejections_name_field_and_value():
    bad("layers", 0, "greater than or equal to 1", layers=0)
    bad("hidden", 30, "not divisible by heads = 4", "30 % 4 = 2", hidden=30)
    bad("hidden", 12, "head dim hidden / heads = 12 / 4 = 3 is odd", hidden=12)
    bad("top_k", 3, "exceeds experts = 2", experts=2, top_k=3)
    bad("experts", -1, "greater than or equal to 0", experts=-1)
    bad("hidde", 32, "unknown field", hidde=32)
    with pytest.raises(ModelConfigError, match="name"):
        ModelConfig(layers=1, hidden=8, heads=2, ffn=8, vocab=8, seq=4)


def test_example_configs_load(tmp_path):
    cfgs = {p.stem: ModelConfig.from_toml(p) for p in sorted(EXAMPLES.glob("*.toml"))}
    assert {"tiny", "tiny-moe", "llama-70b", "moe-8x7b"} <= set(cfgs)
    assert 60e9 < cfgs["llama-70b"].num_params() < 90e9 and not cfgs["llama-70b"].is_moe
    assert cfgs["llama3.1-8b"].rope_scaling.factor == 8.0 and cfgs["qwen3-30b-a3b"].head_dim == 128
    assert cfgs["moe-8x7b"].experts == 8 and cfgs["moe-8x7b"].top_k == 2
    (tmp_path / "m.toml").write_text('[model]\nname = "x"\nlayers = 1\nhidden = 8\nheads = 2\nffn = 8\n'
                                     'vocab = 8\nseq = 4\n')
    assert ModelConfig.from_toml(tmp_path / "m.toml").hidden == 8
    (tmp_path / "b.toml").write_text('name = "x"\nlayers = 0\nhidden = 8\nheads = 2\nffn = 8\nvocab = 8\nseq = 4\n')
    with pytest.raises(ModelConfigError, match="layers = 0"):
        ModelConfig.from_toml(tmp_path / "b.toml")
    with pytest.raises(ModelConfigError, match="cannot read"):
        ModelConfig.from_toml(tmp_path / "none.toml")


def test_gpt_names_params_and_determinism():
    cfg = ModelConfig(**TINY)
    m = build_model(cfg, seed=3)
    assert isinstance(m, GPT)
    names = {n for n, _ in m.named_parameters()}
    for part in ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "mlp.w1", "mlp.w3", "mlp.w2", "attn_norm", "ffn_norm"):
        assert f"blocks.1.{part}.weight" in names
    assert {"embed.weight", "norm.weight", "head.weight"} <= names
    assert all(isinstance(getattr(m.blocks[0].attn, w), torch.nn.Linear) for w in ("wq", "wk", "wv", "wo"))
    assert m.blocks[0].attn.wq.bias is None
    assert sum(p.numel() for p in m.parameters()) == cfg.num_params()
    again = build_model(cfg, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(m.parameters(), again.parameters()))
    other = build_model(cfg, seed=4)
    assert not torch.equal(m.blocks[0].attn.wq.weight, other.blocks[0].attn.wq.weight)
    with pytest.raises(TypeError, match="expected a ModelConfig"):
        build_model(dict(TINY))


def test_gpt_forward_is_causal_and_every_op_goes_through_hal_ops(monkeypatch):
    hal.accelerator()  # binds hal.ops
    cfg = ModelConfig(**TINY)
    m = build_model(cfg)
    calls = {}
    for op in ("linear", "rms_norm", "scaled_dot_product_attention", "rotary_embedding", "silu", "embedding"):
        fn = getattr(hal.ops, "_" + op)

        def counted(*a, _fn=fn, _op=op, **k):
            calls[_op] = calls.get(_op, 0) + 1
            return _fn(*a, **k)
        monkeypatch.setattr(hal.ops, "_" + op, counted)
    ids = torch.randint(0, cfg.vocab, (2, cfg.seq))
    out = m(ids)
    assert out.shape == (2, cfg.seq, cfg.vocab)
    L = cfg.layers
    assert calls == {"embedding": 1, "linear": 7 * L + 1, "rms_norm": 2 * L + 1, "rotary_embedding": 2 * L,
                     "scaled_dot_product_attention": L, "silu": L}
    changed = ids.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % cfg.vocab
    out2 = m(changed)
    assert torch.allclose(out[:, :10], out2[:, :10], atol=1e-6) and not torch.allclose(out[:, 10:], out2[:, 10:])
    with pytest.raises(ValueError, match="exceeds the config's seq = 16"):
        m(torch.zeros(1, 17, dtype=torch.long))


def test_rotary_scores_depend_on_relative_position_only():
    hal.accelerator()
    d, seq = 8, 12
    cos, sin = rotary_tables(seq, d, 10000.0)
    q, k = torch.randn(d), torch.randn(d)

    def rot(x, pos):
        return hal.ops.rotary_embedding(x.view(1, d), cos[pos:pos + 1], sin[pos:pos + 1]).view(d)
    s1 = rot(q, 5) @ rot(k, 2)
    s2 = rot(q, 9) @ rot(k, 6)
    assert torch.allclose(s1, s2, atol=1e-5) and not torch.allclose(s1, rot(q, 5) @ rot(k, 4), atol=1e-3)


def test_moe_variant_and_aux_loss():
    cfg = ModelConfig(**{**TINY, "experts": 4, "top_k": 2, "ffn": 16})
    m = build_model(cfg)
    assert hasattr(m.blocks[0], "moe") and not hasattr(m.blocks[0], "mlp")
    assert sum(p.numel() for p in m.parameters()) == cfg.num_params()
    assert build_model(ModelConfig(**TINY)).aux_loss() is None
    m(torch.randint(0, cfg.vocab, (2, cfg.seq)))
    aux = m.aux_loss()
    assert aux is not None and aux.item() > 0 and aux.requires_grad


def test_losses_and_data():
    cfg = ModelConfig(**TINY)
    data = make_batches(cfg, 2, 4)
    assert data.shape == (2, 4, cfg.seq + 1)
    logits = torch.randn(4, cfg.seq, cfg.vocab)
    y = data[0, :, 1:].clone()
    assert torch.allclose(lm_loss_sum(logits, y), lm_loss(logits, y) * y.numel(), rtol=1e-5)
    y[0, :3] = -100
    assert count_tokens(y) == y.numel() - 3


# ---- counts against REFERENCE.md ("Training cost formulas") ----------------------------------------------
def test_counts_match_reference_formulas():
    h, L, V, s, a = 768, 12, 50304, 1024, 12
    cfg = ModelConfig(name="gpt2ish", layers=L, hidden=h, heads=a, ffn=8 * h // 3, vocab=V, seq=s)
    assert 3 * cfg.ffn == 8 * h  # SwiGLU width 8h/3: the MLP has 8h^2 weights, as a 4h GeLU MLP
    # parameters ~ 12 L h^2 + V h: ours adds the untied head V h and the RMSNorm gains (2L + 1) h
    assert cfg.num_params() == 12 * L * h * h + V * h + V * h + (2 * L + 1) * h
    # per layer: 6 x params x tokens for the matmuls, plus the attention-score term; per iteration
    # that is REFERENCE's 72 B s L h^2 (1 + s/(6h)) (the V term is the head's, below)
    B = 8
    tokens = B * s
    matmul_params = 12 * h * h
    assert cfg.layer_flops(tokens) == 6 * matmul_params * tokens + 12 * s * h * tokens
    assert L * cfg.layer_flops(tokens) == pytest.approx(72 * B * s * L * h * h * (1 + s / (6 * h)), rel=1e-12)
    # full recompute: one more forward -> "8 with full recompute"
    assert cfg.layer_flops(tokens, "full") == 8 * matmul_params * tokens + 16 * s * h * tokens
    # the head: 6 V h per token; REFERENCE's V/(16 L h) term gives 4.5 V h (a rounder estimate)
    assert cfg.head_flops(tokens) == 6 * V * h * tokens
    assert cfg.train_flops(tokens) == L * cfg.layer_flops(tokens) + cfg.head_flops(tokens)
    # activation bytes per layer (16-bit), Korthikanti's s b h (34 + 5 a s / h) with the real MLP: a
    # fused SwiGLU keeps 6f = 16h at f = 8h/3 (their GeLU 4h MLP's), torch's eager SwiGLU 8f
    f = cfg.ffn
    assert cfg.activation_bytes(B, fused_swiglu=True) == pytest.approx(s * B * h * (34 + 5 * a * s / h))
    assert cfg.activation_bytes(B) == pytest.approx(s * B * (18 * h + 8 * f + 5 * a * s))
    # with TP t: s b h (10 + 24/t + 5 a s/(h t))
    assert cfg.activation_bytes(B, tp=4, fused_swiglu=True) == pytest.approx(
        s * B * h * (10 + 24 / 4 + 5 * a * s / (h * 4)))
    assert cfg.activation_bytes(B, recompute="full") == 2 * s * B * h
    assert cfg.activation_bytes(B, tp=2, attention="fused") == pytest.approx(s * B * (10 * h + (8 * h + 8 * f) / 2))
    # mixed-precision Adam: 16 bytes/param plain DP; ZeRO-2 2 + 14/d; ZeRO-3 16/d
    assert [cfg.state_bytes_per_param(z, 8) for z in (0, 2, 3)] == [16, 2 + 14 / 8, 2]
    with pytest.raises(ModelConfigError, match="zero = 5"):
        cfg.state_bytes_per_param(5, 8)
    assert cfg.layer_param_bytes() == 2 * cfg.layer_params()


def test_moe_counts():
    h, f, E, k = 64, 128, 8, 2
    cfg = ModelConfig(name="m", layers=2, hidden=h, heads=4, ffn=f, vocab=100, seq=32, experts=E, top_k=k)
    assert cfg.layer_params() == 4 * h * h + E * 3 * h * f + h * E + 2 * h
    # a token meets top_k experts and the router: forward 2 x (4h^2 + k 3hf + hE) + 4 s h
    assert cfg.layer_forward_flops(10) == 10 * (2 * (4 * h * h + k * 3 * h * f + h * E) + 4 * 32 * h)


# ---- the families' fields (GQA, head_dim, biases, q/k norm, rope scaling, tied head, shared experts) ---------
FAMILY = dict(TINY, heads=4, kv_heads=2, head_dim=12, qkv_bias=True, qk_norm=True, tie_embeddings=True,
              rope_scaling=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=4))
SHARED = dict(experts=4, ffn=16, shared_experts=2, shared_expert_gate=True, norm_topk_prob=False)


def test_family_fields_validate_and_derive():
    bad("kv_heads", 3, "does not divide heads = 4", "4 % 3 = 1", kv_heads=3)
    bad("head_dim", 7, "is odd", head_dim=7)
    bad("shared_experts", 1, "needs a MoE model", shared_experts=1)
    bad("shared_ffn", 8, "shared_experts = 0", experts=2, shared_ffn=8)
    bad("rope_scaling.high_freq_factor", 1.0, "must exceed low_freq_factor = 4.0",
        rope_scaling=dict(factor=8.0, low_freq_factor=4.0, high_freq_factor=1.0, original_max_position=8))
    bad("rope_scaling.type", "yarn", "llama3", rope_scaling=dict(type="yarn", factor=8.0, low_freq_factor=1.0,
                                                                 high_freq_factor=4.0, original_max_position=8))
    cfg = ModelConfig(**TINY)
    assert (cfg.kv_heads, cfg.head_dim, cfg.q_dim, cfg.kv_dim) == (4, 8, 32, 32)
    # derived fields dump as None, so a dump with a new size derives them again (the trainer's overrides)
    assert cfg.model_dump()["head_dim"] is None and ModelConfig(**{**cfg.model_dump(), "hidden": 64}).head_dim == 16
    assert ModelConfig(**{**TINY, "kv_heads": 4, "head_dim": 8}) == cfg   # a default given is the default
    fam = ModelConfig(**FAMILY)
    assert (fam.q_dim, fam.kv_dim) == (48, 24) and ModelConfig(**fam.model_dump()) == fam
    moe = ModelConfig(**{**TINY, **SHARED})
    assert moe.shared_ffn == 2 * 16 and moe.model_dump()["shared_ffn"] is None


def test_family_counts_follow_every_field():
    fam = ModelConfig(**FAMILY)
    h, q, c, d, f, V = 32, 48, 24, 12, 64, 64
    assert fam.attention_params() == 2 * h * q + 2 * h * c + (q + 2 * c) + 2 * d
    assert fam.layer_params() == fam.attention_params() + 3 * h * f + 2 * h
    assert fam.head_params() == h  # tied: only the final norm
    model = build_model(fam)
    assert model.head.weight is model.embed.weight
    assert sum(p.numel() for p in model.parameters()) == fam.num_params()
    tokens, s = 10, fam.seq
    assert fam.layer_forward_flops(tokens) == tokens * (2 * (2 * h * q + 2 * h * c + 3 * h * f) + 4 * s * q)
    assert fam.head_flops(tokens) == 6 * V * h * tokens  # the tied head is still a matmul
    b = 2
    assert fam.activation_bytes(b, tp=2) == pytest.approx(s * b * (10 * h + (4 * q + 4 * c + 16 * h + 2 * (q + c)
                                                                             + 5 * 4 * s) / 2))
    moe = ModelConfig(**{**TINY, **SHARED})
    F, E, k = 32, 4, 2
    assert moe.shared_params() == 3 * h * F + h
    assert moe.layer_params() == 4 * h * h + E * 3 * h * 16 + h * E + 3 * h * F + h + 2 * h
    assert moe.layer_forward_flops(1) == 2 * (4 * h * h + k * 3 * h * 16 + h * E + 3 * h * F + h) + 4 * s * h
    assert moe.active_params() == moe.num_params() - moe.layers * (E - k) * 3 * h * 16
    m = build_model(moe)
    assert sum(p.numel() for p in m.parameters()) == moe.num_params()


def test_gqa_is_mha_with_repeated_kv_heads():
    """The definition of grouped-query attention: the same logits as full multi-head attention whose
    K/V projections repeat each K/V head for its heads / kv_heads query heads (HF repeat_kv's order)."""
    hal.accelerator()
    gqa_cfg = ModelConfig(**{**TINY, "kv_heads": 2})
    gqa, mha = build_model(gqa_cfg, seed=5), build_model(ModelConfig(**TINY), seed=5)
    state = gqa.state_dict()
    for name, t in state.items():
        if name.endswith(("attn.wk.weight", "attn.wv.weight")):   # (kv heads x d, h) -> (heads x d, h)
            state[name] = t.view(2, 8, 32).repeat_interleave(2, dim=0).reshape(32, 32)
    mha.load_state_dict(state)
    ids = torch.randint(0, 64, (2, 16))
    assert torch.allclose(gqa(ids), mha(ids), atol=1e-5)


def test_family_forward_goes_through_hal_ops_and_tied_stage_refused():
    hal.accelerator()
    fam = ModelConfig(**FAMILY)
    m = build_model(fam)
    out = m(torch.randint(0, fam.vocab, (2, fam.seq)))
    assert out.shape == (2, fam.seq, fam.vocab) and torch.isfinite(out).all()
    assert m.blocks[0].attn.wq.bias is not None and m.blocks[0].attn.q_norm.weight.shape == (12,)
    m.embed = None   # a last pipeline stage: the tied head would be a copy that drifts
    with pytest.raises(ModelConfigError, match="tie_embeddings"):
        m(torch.randn(1, 4, 32))


def test_tp_refuses_kv_heads_not_dividing():
    from hal.strategies.tensor_parallel import TensorParallelError, _check_divides
    model = build_model(ModelConfig(**{**TINY, "kv_heads": 2}))
    _check_divides(model, 2)
    with pytest.raises(TensorParallelError, match=r"2 key/value heads \(wk 16 = 2 x head_dim 8\).*TP degree 4"):
        _check_divides(model, 4)


def test_shared_experts_are_dense_not_expert_parallel():
    from hal.strategies.expert_parallel import apply_ep, expert_parameter_names
    m = build_model(ModelConfig(**{**TINY, **SHARED}))
    names = apply_ep(m, None)
    assert names and not any("shared" in n for n in names)
    assert {"blocks.0.moe.shared.w1.weight", "blocks.0.moe.shared_gate.weight"} <= {n for n, _ in m.named_parameters()}
    assert expert_parameter_names(m) == names


# Published sizes (the 1% check of issue 23): Llama-2-70B 68,976,648,192 = the bf16 bytes 137,953,296,384
# of meta-llama/Llama-2-70b-hf's model.safetensors.index.json / 2; Mixtral-8x7B 46.7 B total, 12.9 B active
# (Mistral AI, "Mixtral of experts", mistral.ai/news/mixtral-of-experts, 2023-12-11); Llama-3.1-8B 8.03 B
# (meta-llama/Llama-3.1-8B model card); Qwen1.5-MoE-A2.7B 14.3 B total, 2.7 B active (its model card);
# Qwen3-30B-A3B 30.5 B total, 3.3 B active (its model card, which rounds our 3.353 B down).
PUBLISHED = {"llama-70b": (68.98e9, None), "moe-8x7b": (46.7e9, 12.9e9), "llama3.1-8b": (8.03e9, None),
             "qwen1.5-moe-a2.7b": (14.3e9, 2.7e9), "qwen3-30b-a3b": (30.5e9, 3.3e9)}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_example_counts_match_published_sizes(name):
    cfg = ModelConfig.from_toml(EXAMPLES / f"{name}.toml")
    total, active = PUBLISHED[name]
    assert cfg.num_params() == pytest.approx(total, rel=0.01)
    if active:
        assert cfg.active_params() == pytest.approx(active, rel=0.02 if name == "qwen3-30b-a3b" else 0.01)
    if name == "llama-70b":
        assert cfg.num_params() == 68_976_648_192 and cfg.kv_heads == 8
