"""Hugging Face checkpoints into and out of our decoder: the weights of a local HF checkpoint directory
read per rank through torch's DCP Hugging Face storage reader, and a full state written back as one.

    cfg = model_config_from_hf(hf_dir)                  # config.json -> ModelConfig (hf_map.config_from_hf)
    stats = load_hf_weights(run.modules, cfg, hf_dir)   # after apply_plan: this rank's tensors only
    export_hf(our_full_state, cfg, out_dir)             # config.json + safetensors that transformers loads

Load (`[model] hf = DIR` in `hal train`): DIR holds config.json and *.safetensors (one file, or shards
with model.safetensors.index.json). Each rank builds a state dict of ONLY the parameters its stage
modules hold - the layers of its pipeline stages, the experts its EP rank hosts (an expert-parallel MoE
layer keeps only those), and of a tensor-parallel or FSDP2 parameter the DTensor itself - keyed by the
on-disk HF key (hal.strategies.models.hf_map.hf_key), and `dcp.load(..., no_dist=True)` fills it in
place through `torch.distributed.checkpoint.HuggingFaceStorageReader`: DCP's planner asks the reader
for each DTensor's local offsets and lengths, and the reader slices with safetensors' `get_slice`, so
a rank copies only its shard (the file is memory-mapped by safetensors; what a rank reads is what
the mapped pages it touches are). No collective runs: each rank reads on its own. The values are
cast on copy (a bf16 checkpoint into float32 parameters). `LoadStats` counts the tensors, elements
and bytes (in the file's dtype) each rank asked for; the trainer logs them.

This relies on hf_map mapping each parameter to one HF tensor unchanged but for its name
(`from_hf_state(hf)[name] == hf[hf_key(name)]`, tests/test_hf_load.py holds it for the families we
load); a tied head (`tie_embeddings`) reads the embedding's key.

Export writes config.json (hf_map.config_to_hf) and the safetensors with DCP's
`HuggingFaceStorageWriter` from one process (`dcp.save(..., no_dist=True)`, the full state in
memory: `hal export` gathers it from our checkpoint with `read_dcp_state`): it is torch's writer of
the format (shards by `max_shard_bytes` with model.safetensors.index.json, safetensors metadata
`format = pt` that transformers checks), so we write no safetensors code of our own.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Optional, Union

import torch
from torch import nn

from hal.contract.errors import HalError

from .config import ModelConfig

log = logging.getLogger(__name__)

CONFIG_JSON = "config.json"
SUFFIX = ".safetensors"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")
MAX_SHARD_BYTES = 5 << 30  # save_pretrained's default shard size (5 GB)


@contextlib.contextmanager
def _one_process() -> Iterator[None]:
    """Silence DCP's warning that no process group is in use: reading or writing in this one process
    (no_dist=True) is the intent here, not an accident."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


class HFCheckpointError(HalError, ValueError):
    """A Hugging Face checkpoint directory that cannot be read or written; the message names the
    directory (and the key, shape or rank) that was wrong."""


# ---- the directory --------------------------------------------------------------------------------
def read_hf_config(hf_dir: Union[str, Path]) -> dict:
    """config.json of a HF checkpoint directory, after checking it holds safetensors weights."""
    d = Path(hf_dir)
    if not d.is_dir():
        raise HFCheckpointError(f"HF checkpoint {d}: no such directory")
    path = d / CONFIG_JSON
    if not path.is_file():
        raise HFCheckpointError(f"HF checkpoint {d}: no {CONFIG_JSON}")
    if not any(d.glob("*" + SUFFIX)):
        bins = sorted(p.name for p in d.glob("*.bin"))
        hint = f" (it has {bins[:2]}: PyTorch pickles are not read; re-save with safe_serialization)" if bins else ""
        raise HFCheckpointError(f"HF checkpoint {d}: no *{SUFFIX} weights{hint}")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise HFCheckpointError(f"HF checkpoint {path}: not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise HFCheckpointError(f"HF checkpoint {path}: expected a JSON object, got {type(data).__name__}")
    return data


def model_config_from_hf(hf_dir: Union[str, Path]) -> ModelConfig:
    """The ModelConfig of a HF checkpoint directory (hf_map.config_from_hf: an unsupported field is
    refused by name)."""
    data = read_hf_config(hf_dir)
    from .hf_map import config_from_hf
    return config_from_hf(data)


# ---- load -----------------------------------------------------------------------------------------
@dataclass
class LoadStats:
    """What one rank asked the HF reader for."""

    tensors: int = 0
    elements: int = 0
    bytes: int = 0  # in the checkpoint's dtype
    seconds: float = 0.0
    keys: list[str] = field(default_factory=list)

    def describe(self) -> str:
        return (f"{self.tensors} tensors, {self.elements:,} elements, {self.bytes / 2**20:.2f} MiB read "
                f"in {self.seconds:.2f} s")


def _reader(hf_dir: str, stats: LoadStats) -> Any:
    """torch's HuggingFaceStorageReader, counting every read request (key, elements, bytes)."""
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    class CountingReader(HuggingFaceStorageReader):
        def read_data(self, plan, planner):
            keys = set()
            for item in plan.items:
                info = self.storage_data[item.storage_index]
                n = math.prod(item.lengths)
                keys.add(item.storage_index.fqn)
                stats.elements += n
                stats.bytes += n * info.dtype.itemsize
            stats.keys = sorted(keys)
            stats.tensors = len(keys)
            return super().read_data(plan, planner)

    return CountingReader(hf_dir)


def local_parameters(modules: Union[Mapping[int, nn.Module], Iterable[nn.Module], nn.Module]) -> dict[str, Any]:
    """name -> parameter of the full model's names for every parameter these stage modules hold
    (DDP's `.module` unwrapped; FSDP2 and TP leave them in place, as DTensors)."""
    if isinstance(modules, nn.Module):
        modules = [modules]
    elif isinstance(modules, Mapping):
        modules = list(modules.values())
    out: dict[str, Any] = {}
    for m in modules:
        inner = getattr(m, "module", m)
        for name, p in inner.named_parameters():
            out.setdefault(name, p)
    return out


def _wanted(params: dict[str, Any], cfg: ModelConfig) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """(HF key -> destination tensor, [(name, key)] of parameters sharing a key with an earlier one):
    a tied head on the embedding's rank reads the key once and is copied after."""
    from .hf_map import hf_key
    state: dict[str, Any] = {}
    owner: dict[str, Any] = {}
    aliases: list[tuple[str, str]] = []
    for name, p in params.items():
        key = hf_key(name, cfg)
        if key in state:
            if owner[key] is not p:
                aliases.append((name, key))
            continue
        state[key], owner[key] = p.detach(), p
    return state, aliases


def _check_against(state: dict[str, Any], metadata: Any, hf_dir: str, rank: Optional[int]) -> None:
    """Every wanted key on disk with the parameter's global shape; else one error naming them."""
    where = f"HF checkpoint {hf_dir}" + (f", rank {rank}" if rank is not None else "")
    stored = metadata.state_dict_metadata
    missing = sorted(k for k in state if k not in stored)
    if missing:
        raise HFCheckpointError(f"{where}: {len(missing)} tensors this rank needs are not in the checkpoint, "
                                f"e.g. {missing[:3]} (a config.json that does not match the weights?)")
    for key, t in state.items():
        if tuple(stored[key].size) != tuple(t.shape):
            raise HFCheckpointError(f"{where}: {key} has shape {tuple(stored[key].size)} on disk, the model "
                                    f"expects {tuple(t.shape)}")


def load_hf_weights(modules: Union[Mapping[int, nn.Module], Iterable[nn.Module], nn.Module], cfg: ModelConfig,
                    hf_dir: Union[str, Path], rank: Optional[int] = None) -> LoadStats:
    """Fill the parameters of this rank's stage modules (`AppliedPlan.modules`, or any modules named
    like GPT's) from the HF checkpoint in `hf_dir`, in place, reading only their tensors (module
    doc). Call it after the layout (apply_plan) and its materialisation, before the optimizer's
    first step. Returns what was read; logs it at debug level."""
    import torch.distributed.checkpoint as dcp
    hf_dir = str(hf_dir)
    read_hf_config(hf_dir)  # the directory's shape, with a clear message
    t0 = time.perf_counter()
    params = local_parameters(modules)
    stats = LoadStats()
    if not params:
        return stats
    state, aliases = _wanted(params, cfg)
    reader = _reader(hf_dir, stats)
    _check_against(state, reader.read_metadata(), hf_dir, rank)
    with torch.no_grad(), _one_process():
        dcp.load(state, storage_reader=reader, no_dist=True)
        for name, key in aliases:
            params[name].copy_(state[key])
    stats.seconds = time.perf_counter() - t0
    log.debug(f"hf load: rank {rank if rank is not None else '?'} {stats.describe()} from {hf_dir}")
    return stats


# ---- export ---------------------------------------------------------------------------------------
def read_dcp_state(checkpoint: Union[str, Path], prefix: str) -> dict[str, torch.Tensor]:
    """The full tensors of every entry of a DCP checkpoint whose key starts with `prefix`, keyed without
    it, in this one process (`dcp.load(..., no_dist=True)` into tensors sized from the checkpoint's own
    metadata: DCP assembles each from whatever shards the ranks wrote)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    path = str(checkpoint)
    reader = dcp.FileSystemReader(path)
    try:
        md = reader.read_metadata()
    except (OSError, ValueError) as exc:
        raise HFCheckpointError(f"checkpoint {path}: no readable DCP metadata ({exc})") from None
    state = {k: torch.empty(tuple(v.size), dtype=v.properties.dtype)
             for k, v in md.state_dict_metadata.items()
             if k.startswith(prefix) and isinstance(v, TensorStorageMetadata)}
    if not state:
        raise HFCheckpointError(f"checkpoint {path}: no entries named {prefix}* (not a hal train checkpoint?)")
    with _one_process():
        dcp.load(state, storage_reader=reader, no_dist=True)
    return {k[len(prefix):]: v for k, v in state.items()}


def _shards(state: Mapping[str, torch.Tensor], max_shard_bytes: int) -> dict[str, int]:
    """key -> file index (1-based), filling files up to max_shard_bytes in key order."""
    index, used, out = 1, 0, {}
    for key in state:
        n = state[key].numel() * state[key].element_size()
        if used and used + n > max_shard_bytes:
            index, used = index + 1, 0
        out[key] = index
        used += n
    return out


def export_hf(our_state: Mapping[str, torch.Tensor], cfg: ModelConfig, out_dir: Union[str, Path],
              dtype: Optional[torch.dtype] = None, max_shard_bytes: int = MAX_SHARD_BYTES,
              copy_from: Optional[Union[str, Path]] = None) -> Path:
    """Write our full state (the full model's names) as a HF checkpoint in `out_dir`: config.json
    (hf_map.config_to_hf) and safetensors through DCP's HuggingFaceStorageWriter, in this one process.
    `dtype` casts floating tensors (None: as they are); `copy_from` (the HF directory the run started
    from) gives the tokenizer files to copy alongside."""
    import shutil

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    from .hf_map import config_to_hf, to_hf_state
    out = Path(out_dir)
    if out.is_file():
        raise HFCheckpointError(f"export to {out}: a file is there, not a directory")
    if copy_from is not None and out.resolve() == Path(copy_from).resolve():
        raise HFCheckpointError(f"export to {out}: that is the HF checkpoint the run started from; export elsewhere")
    hf_state = to_hf_state(dict(our_state), cfg)
    state = {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).detach().contiguous()
             for k, v in hf_state.items()}
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*" + SUFFIX):  # a previous export's shards would be read with these
        old.unlink()
    config = config_to_hf(cfg)
    if dtype is not None:
        config["torch_dtype"] = str(dtype).removeprefix("torch.")
    (out / CONFIG_JSON).write_text(json.dumps(config, indent=2) + "\n")
    writer = HuggingFaceStorageWriter(str(out), fqn_to_index_mapping=_shards(state, max_shard_bytes))
    with _one_process():
        dcp.save(state, storage_writer=writer, no_dist=True)
    if copy_from is not None:
        for name in TOKENIZER_FILES:
            src = Path(copy_from) / name
            if src.is_file() and name != CONFIG_JSON:
                shutil.copyfile(src, out / name)
    return out


# ---- a run's record and its checkpoints -----------------------------------------------------------
RUN_RECORD = "model.json"
CHECKPOINT_PREFIX = "model."  # hal.trainer.checkpoint's keys of the model's parameters


def write_run_record(run_dir: Union[str, Path], cfg: ModelConfig, checkpoint_dir: Union[str, Path],
                     hf_dir: Optional[Union[str, Path]] = None) -> Path:
    """<run dir>/model.json: the run's ModelConfig (overrides applied), its checkpoint directory and the
    HF directory it started from, so `hal export --run` maps its checkpoints without the train config."""
    path = Path(run_dir) / RUN_RECORD
    path.write_text(json.dumps({"model": cfg.model_dump(mode="json"), "checkpoint_dir": str(checkpoint_dir),
                                "hf": None if hf_dir is None else str(hf_dir)}, indent=1) + "\n")
    return path


def read_run_record(run_dir: Union[str, Path]) -> tuple[ModelConfig, Path, Optional[Path]]:
    """(model config, checkpoint directory, HF source or None) of a `hal train` run directory."""
    path = Path(run_dir) / RUN_RECORD
    if not Path(run_dir).is_dir():
        raise HFCheckpointError(f"run {run_dir}: no such directory")
    try:
        rec = json.loads(path.read_text())
        cfg = ModelConfig(**rec["model"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise HFCheckpointError(f"run {run_dir}: no readable {RUN_RECORD} (written by `hal train` at the start of "
                                f"a run): {type(exc).__name__}: {exc}") from None
    return cfg, Path(rec["checkpoint_dir"]), Path(rec["hf"]) if rec.get("hf") else None


def export_checkpoint(step_path: Union[str, Path], cfg: ModelConfig, out_dir: Union[str, Path],
                      dtype: Optional[torch.dtype] = None, copy_from: Optional[Union[str, Path]] = None) -> Path:
    """One `hal train` checkpoint (`<checkpoint dir>/step_<N>`) as a HF checkpoint in `out_dir`, in this
    process: the full model gathered by read_dcp_state, mapped and written by export_hf."""
    state = read_dcp_state(step_path, CHECKPOINT_PREFIX)
    return export_hf(state, cfg, out_dir, dtype=dtype, copy_from=copy_from)
