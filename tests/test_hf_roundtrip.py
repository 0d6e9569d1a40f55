"""A Hugging Face checkpoint through `hal train` and back, against `transformers` itself (no download: a
tiny random Llama with grouped-query attention made by examples/hf/make_tiny.py in a tmp dir).

One launch on an emulated cuda:1,ascend:1 cluster (both chips EMULATED on this host's CPU, the hetero
bridge between them), a 2-stage pipeline (cuda: embedding + layer 0, ascend: layer 1 + norm + head):
- each rank reads through DCP's HF reader only its stage's tensors (disjoint, together the whole file);
- step 0's loss (the loaded weights, before any update) equals transformers' loss on the same batch;
- `hal export --hf` of the run's checkpoint loads in transformers with no missing or unexpected key,
  equals `[checkpoint] export_hf`'s copy, differs from the start (it trained), and transformers'
  logits on a fixed input equal ours computed from the same exported weights.
In this process, a tiny transformers Mixtral goes in and out through DCP's HF reader and writer (MoE's
per-expert on-disk keys both ways).
Tolerances, float32 on both sides: the two models run the same math in a different op order
(sdpa vs our reference attention, fused vs separate projections), so logits agree to float32
rounding accumulated over 2 layers: max |diff| <= 1e-4 x max(1, max |logit|) (measured ~1e-6), and
the loss to 1e-5 relative.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from hal.testing import WorkerPool

ROOT = Path(__file__).resolve().parent.parent
EMULATE = "cuda:1,ascend:1"
SEQ, BATCH, STEPS = 32, 4, 3


def _make_tiny():
    spec = importlib.util.spec_from_file_location("make_tiny", ROOT / "examples/hf/make_tiny.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.make_tiny_llama


def _train_case(config: dict) -> dict:
    """Rank side: the Trainer of `config`, what its HF load read, its run, and (rank 0) step 0's batch."""
    from hal.trainer.config import TrainConfig
    from hal.trainer.data import train_batch
    from hal.trainer.trainer import Trainer
    cfg = TrainConfig(**config)
    trainer = Trainer(cfg, report=False)
    loaded = trainer.hf_loaded
    batch = train_batch(trainer.corpus, cfg.seed, 0, cfg.global_batch, trainer.model_cfg.seq)
    out = trainer.train()
    out.update(hf_keys=loaded.keys, hf_bytes=loaded.bytes, batch=batch if trainer.rank == 0 else None)
    return out


def _config(hf_dir: Path, run_dir: Path, final: Path) -> dict:
    return {"seed": 0, "steps": STEPS, "global_batch": BATCH, "backend": "hetero", "timeout_s": 60,
            "model": {"hf": str(hf_dir), "overrides": {"seq": SEQ}},
            "data": {"max_bytes": 1 << 18},
            "optimizer": {"lr": 1e-2, "warmup_steps": 1},
            "plan": {"source": "even", "pp": 2, "num_microbatches": 2},
            "checkpoint": {"export_hf": str(final)},
            "log": {"dir": str(run_dir), "val_interval": 0, "val_batches": 1}}


def _files(d: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    out: dict[str, torch.Tensor] = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(load_file(f))
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf_roundtrip")
    hf_dir = _make_tiny()(tmp / "tiny", vocab=256, hidden=32, ffn=64, layers=2, heads=4, kv_heads=2, seq=64,
                          seed=0, tokenizer=False)
    config = _config(hf_dir, tmp / "run", tmp / "final")
    with WorkerPool(2, env={"HAL_EMULATE": EMULATE, "OMP_NUM_THREADS": "1"}) as pool:
        results = pool.run(_train_case, config, timeout=240)
    return {"hf": hf_dir, "run": tmp / "run", "final": tmp / "final", "tmp": tmp, "results": results}


def test_each_rank_reads_only_its_stage(run):
    r0, r1 = run["results"]
    disk = _files(run["hf"])
    assert set(r0["hf_keys"]).isdisjoint(r1["hf_keys"])
    assert set(r0["hf_keys"]) | set(r1["hf_keys"]) == set(disk)
    assert "model.embed_tokens.weight" in r0["hf_keys"] and "lm_head.weight" in r1["hf_keys"]
    assert not any(".layers.1." in k for k in r0["hf_keys"]) and not any(".layers.0." in k for k in r1["hf_keys"])
    for r in (r0, r1):
        assert r["hf_bytes"] == sum(disk[k].numel() * disk[k].element_size() for k in r["hf_keys"])


def test_step0_loss_equals_transformers_loss(run):
    from transformers import AutoModelForCausalLM
    inputs, targets = run["results"][0]["batch"]
    model = AutoModelForCausalLM.from_pretrained(run["hf"]).eval()
    with torch.no_grad():
        logits = model(inputs).logits
    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1)).item()
    ours = run["results"][0]["losses"][0]
    assert ours == pytest.approx(ref, rel=1e-5), (ours, ref)
    assert run["results"][0]["losses"][-1] < ours  # and it trained


def test_export_loads_in_transformers_with_our_logits(run):
    from transformers import AutoModelForCausalLM

    from hal.cli import main
    from hal.strategies.models import build_model
    from hal.strategies.models.hf_io import load_hf_weights, model_config_from_hf
    out = run["tmp"] / "export"
    assert main(["export", "--hf", str(out), "--run", str(run["run"])]) == 0
    exported, final, start = _files(out), _files(run["final"]), _files(run["hf"])
    assert set(exported) == set(final) == set(start)
    assert all(torch.equal(exported[k], final[k]) for k in exported)  # [checkpoint] export_hf: the same
    assert any(not torch.equal(exported[k], start[k]) for k in exported)  # the run moved the weights
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    cfg = model_config_from_hf(out)
    ours = build_model(cfg, seed=7)
    load_hf_weights(ours, cfg, out)
    ids = torch.randint(0, cfg.vocab, (2, SEQ), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs, mine = model.eval()(ids).logits, ours(ids)
    err = (theirs - mine).abs().max().item()
    assert err <= 1e-4 * max(1.0, theirs.abs().max().item()), err


def test_export_bad_input_is_one_line_exit_2(run, tmp_path, capsys):
    from hal.cli import main
    assert main(["export", "--hf", str(tmp_path / "o"), "--run", str(tmp_path / "none")]) == 2
    assert main(["export", "--hf", str(tmp_path / "o"), "--run", str(run["run"]), "--step", "99"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "no such directory" in err[0] and "no complete checkpoint of step 99" in err[1], err


def test_mixtral_in_and_out_through_dcp(tmp_path):
    """MoE, in this process: a tiny transformers Mixtral (4 experts, top-2) read through DCP's HF reader
    gives transformers' logits; written back by export_hf, transformers loads it with no missing or
    unexpected key and the same tensors (the per-expert on-disk keys both ways)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    from hal.strategies.models import build_model
    from hal.strategies.models.hf_io import export_hf, load_hf_weights, local_parameters, model_config_from_hf
    torch.manual_seed(0)
    ref = MixtralForCausalLM(MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                           num_experts_per_tok=2, max_position_embeddings=32)).eval()
    ref.save_pretrained(tmp_path / "in")
    cfg = model_config_from_hf(tmp_path / "in")
    ours = build_model(cfg, seed=3).eval()
    load_hf_weights(ours, cfg, tmp_path / "in")
    ids = torch.randint(0, cfg.vocab, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs, mine = ref(ids).logits, ours(ids)
    assert (theirs - mine).abs().max().item() <= 1e-4 * max(1.0, theirs.abs().max().item())
    export_hf({n: p.detach() for n, p in local_parameters(ours).items()}, cfg, tmp_path / "out")
    back, info = MixtralForCausalLM.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert _files(tmp_path / "out").keys() == _files(tmp_path / "in").keys()
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), ref.state_dict().values()))
