"""hal.strategies.models.hf_io, in one process: a HF checkpoint's weights read per rank through torch's
DCP HuggingFaceStorageReader - a pipeline stage reads only its own tensors, a tensor-parallel shard only
its slice (a DTensor on a fake 2-rank process group), values equal to the file's - and the typed
errors for a directory, key or shape that is wrong. The checkpoint is our own random GPT written by
hf_io.export_hf (hf_map's names; tests/test_hf_roundtrip.py holds those against `transformers`), so
this module imports no transformers."""
from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from hal.strategies.apply import StageModule
from hal.strategies.models import ModelConfig, build_model
from hal.strategies.models.hf_io import (HFCheckpointError, export_hf, load_hf_weights, local_parameters,
                                         model_config_from_hf)
from hal.strategies.models.hf_map import from_hf_state, hf_key, to_hf_state

# GQA (2 kv heads for 4 q heads), 2 layers: stage 0 = embed + block 0, stage 1 = block 1 + norm + head
CFG = ModelConfig(name="tiny-llama", layers=2, hidden=32, heads=4, kv_heads=2, ffn=64, vocab=256, seq=16)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """Our random GPT (seed 1) as a HF checkpoint, and its state by our names."""
    out = tmp_path_factory.mktemp("hf")
    state = {k: v.detach().clone() for k, v in build_model(CFG, seed=1).state_dict().items()}
    export_hf(state, CFG, out)
    return out, state


def _on_disk(d) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def test_each_parameter_is_one_hf_tensor_by_hf_key():
    """The loader's premise: hf_map renames and does not transform (from_hf_state(hf)[n] == hf[hf_key(n)])."""
    state = {k: v.detach() for k, v in build_model(CFG, seed=2).state_dict().items()}
    hf = to_hf_state(dict(state), CFG)
    assert len(hf) == len(state)
    for name, t in state.items():
        assert torch.equal(hf[hf_key(name, CFG)], t), name
    back = from_hf_state(hf, CFG)
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)


def test_config_and_full_model_load_equal_the_file(hf_dir):
    d, state = hf_dir
    read = model_config_from_hf(d)
    fields = ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab", "seq", "rope_theta", "norm_eps",
              "tie_embeddings", "experts")
    assert [getattr(read, f) for f in fields] == [getattr(CFG, f) for f in fields]
    model = build_model(CFG, seed=5)  # other values: every one must be overwritten
    stats = load_hf_weights(model, CFG, d)
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), state[name]), name
    disk = _on_disk(d)
    assert stats.tensors == len(disk) and sorted(stats.keys) == sorted(disk)
    assert stats.bytes == sum(t.numel() * t.element_size() for t in disk.values())


def test_a_pipeline_stage_reads_only_its_own_tensors(hf_dir):
    d, state = hf_dir
    stage = StageModule(build_model(CFG, seed=5), (1, 2), first=False, last=True)
    stats = load_hf_weights({1: stage}, CFG, d, rank=1)
    names = set(local_parameters(stage))
    assert names and all(n.startswith(("blocks.1.", "norm.", "head.")) for n in names), names
    assert set(stats.keys) == {hf_key(n, CFG) for n in names}
    assert not any(hf_key(n, CFG) in stats.keys for n in state if n.startswith(("blocks.0.", "embed.")))
    for name, p in stage.named_parameters():
        assert torch.equal(p.detach(), state[name]), name
    assert stats.bytes == sum(state[n].numel() * 4 for n in names)  # float32 on disk
    disk_bytes = sum(t.numel() * t.element_size() for t in _on_disk(d).values())
    print(f"stage 1 of 2 read {stats.describe()} of {disk_bytes / 2**20:.2f} MiB on disk")


@pytest.fixture
def fake_rank1_of_2():
    """This process as rank 1 of a 2-rank world on torch's fake process group (no peer, no traffic)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore
    assert not dist.is_initialized()
    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=2)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_tensor_parallel_shard_reads_only_its_slice(hf_dir, fake_rank1_of_2):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard
    d, state = hf_dir
    mesh = DeviceMesh("cpu", [0, 1])
    stage = StageModule(build_model(CFG, seed=5), (0, 1), first=True, last=False)
    wq = stage.blocks["0"].attn.wq
    full = state["blocks.0.attn.wq.weight"]
    local = torch.zeros(full.shape[0] // 2, full.shape[1])
    wq.weight = torch.nn.Parameter(DTensor.from_local(local, mesh, [Shard(0)], run_check=False))
    stats = load_hf_weights(stage, CFG, d, rank=1)
    assert torch.equal(wq.weight.to_local(), full[full.shape[0] // 2:])  # rank 1's rows, and only those
    others = sum(state[n].numel() for n in local_parameters(stage) if n != "blocks.0.attn.wq.weight")
    assert stats.elements == others + full.numel() // 2


def test_errors_name_the_directory_key_and_shape(hf_dir, tmp_path):
    d, _ = hf_dir
    with pytest.raises(HFCheckpointError, match="no such directory"):
        model_config_from_hf(tmp_path / "nope")
    with pytest.raises(HFCheckpointError, match="no config.json"):
        model_config_from_hf(tmp_path)
    (tmp_path / "config.json").write_text((d / "config.json").read_text())
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(HFCheckpointError, match=r"no \*\.safetensors weights .*pytorch_model\.bin"):
        model_config_from_hf(tmp_path)
    wider = ModelConfig(**{**CFG.model_dump(), "ffn": 96})
    with pytest.raises(HFCheckpointError, match=r"rank 3: model\.layers\.0\.mlp\.\w+_proj\.weight has shape"):
        load_hf_weights(build_model(wider), wider, d, rank=3)
    deeper = ModelConfig(**{**CFG.model_dump(), "layers": 3})
    with pytest.raises(HFCheckpointError, match=r"tensors this rank needs are not in the checkpoint.*layers\.2"):
        load_hf_weights(build_model(deeper), deeper, d)


def test_train_config_model_hf(hf_dir, tmp_path):
    from hal.trainer.config import TrainConfig, TrainConfigError
    d, _ = hf_dir
    base = {"steps": 4, "global_batch": 2, "optimizer": {"warmup_steps": 1}}
    cfg = TrainConfig(**base, model={"hf": str(d), "overrides": {"seq": 8}}).load_model_config()
    assert (cfg.kv_heads, cfg.seq, cfg.vocab) == (2, 8, 256)
    with pytest.raises(TrainConfigError, match="exactly one of model.path and model.hf"):
        TrainConfig(**base, model={"hf": str(d), "path": "x.toml"})
    with pytest.raises(TrainConfigError, match=r"model\.hf = .*no such directory"):
        TrainConfig(**base, model={"hf": str(tmp_path / "nope")}).load_model_config()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.safetensors").write_bytes((d / next(p.name for p in d.glob("*.safetensors"))).read_bytes())
    (bad / "config.json").write_text(json.dumps({**json.loads((d / "config.json").read_text()),
                                                 "model_type": "gpt2"}))
    with pytest.raises(TrainConfigError, match=r"model\.hf = .*gpt2"):
        TrainConfig(**base, model={"hf": str(bad)}).load_model_config()


def test_an_expert_parallel_rank_reads_only_its_experts(tmp_path, fake_rank1_of_2):
    """Mixtral-style MoE (4 experts, top-2): EP rank 1 of 2 hosts experts 2 and 3 and reads only theirs."""
    from hal.strategies.expert_parallel import apply_ep
    moe = ModelConfig(name="tiny-mixtral", layers=1, hidden=32, heads=4, kv_heads=2, ffn=32, vocab=256, seq=16,
                      experts=4, top_k=2, capacity_factor=None)
    state = {k: v.detach().clone() for k, v in build_model(moe, seed=1).state_dict().items()}
    export_hf(state, moe, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "mixtral"
    model = build_model(moe, seed=5)
    apply_ep(model, dist.group.WORLD, [[0, 1], [2, 3]])
    stats = load_hf_weights(model, moe, tmp_path, rank=1)
    experts = {k for k in stats.keys if ".experts." in k}
    assert experts and all(".experts.2." in k or ".experts.3." in k for k in experts), experts
    assert len(experts) == 2 * 3  # w1, w2, w3 of each
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), state[name]), name
