"""`hal export --hf OUT --run RUN_DIR [--step N]`: write a `hal train` run's checkpoint as a Hugging Face
checkpoint that `transformers.AutoModelForCausalLM.from_pretrained(OUT)` loads.

It reads <run dir>/model.json (the run's model config, written by `hal train` at its start) and the
run's DCP checkpoint of step N (default: the newest complete one), gathers the full model in this one
process, maps our parameter names to the Hugging Face ones (hal.strategies.models.hf_map) and writes
config.json plus safetensors shards (torch's DCP HuggingFaceStorageWriter; 5 GB per file, with
model.safetensors.index.json). The tokenizer files of the HF checkpoint the run started from
(`[model] hf`), if any, are copied alongside. The whole model is held in memory once (twice with
--dtype): export on a host with that much memory.

examples:
  hal export --hf out/llama-tuned --run runs/llama-hf
  hal export --hf out/step40 --run runs/llama-hf --step 40 --dtype bfloat16

exit codes: 0 written; 2 bad input (no such run, no model.json, no complete checkpoint, step not there).
"""
from __future__ import annotations

import argparse
from pathlib import Path

DTYPES = ("float32", "bfloat16", "float16")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hf", required=True, metavar="OUT", help="directory to write the HF checkpoint into")
    p.add_argument("--run", required=True, metavar="RUN_DIR", help="the `hal train` run directory ([log] dir)")
    p.add_argument("--step", type=int, default=None, metavar="N",
                   help="checkpoint step to export (default: the newest complete checkpoint)")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="cast the weights (default: as trained, float32 master weights)")


def run(args: argparse.Namespace) -> int:
    import torch

    from hal.strategies.models.hf_io import HFCheckpointError, export_checkpoint, read_run_record
    from hal.trainer.checkpoint import MARK, latest, step_dir
    cfg, ckpt_root, source = read_run_record(args.run)
    step = args.step if args.step is not None else latest(ckpt_root)
    if step is None:
        raise HFCheckpointError(f"run {args.run}: no complete checkpoint under {ckpt_root}")
    path = step_dir(ckpt_root, step)
    if not (path / MARK).is_file():
        have = latest(ckpt_root)
        raise HFCheckpointError(f"run {args.run}: no complete checkpoint of step {step} ({path}); newest complete: "
                                f"{'none' if have is None else have}")
    dtype = getattr(torch, args.dtype) if args.dtype else None
    out = export_checkpoint(path, cfg, args.hf, dtype=dtype, copy_from=source)
    files = sorted(p.name for p in Path(out).iterdir())
    print(f"hal export: step {step} of {args.run} ({cfg.name}, {cfg.num_params():,} parameters) -> {out}: "
          f"{', '.join(files)}")
    return 0
