"""Offline byte-level language-model data: the Python standard library's own source files (every
machine with Python has them, no download) or a user's text files, read in sorted path order, split
into train and validation by file (a stable hash of each file's relative path, so adding a file moves
no other), and sampled as a pure function of (seed, step): resuming needs only the step counter.

Each step's global batch is `global_batch` windows of seq + 1 bytes (inputs = first seq, targets =
last seq; vocab 256). Every rank draws the same global batch - the loss is normalised by the global
token count (hal/strategies/apply.py) - and the plan cuts it: micro-batch m is rows [m*mb, (m+1)*mb), and
replica j of a stage takes rows `plan.rows(stage, j)` of each micro-batch, so a faster chip's replica
with more rows gets proportionally more of the data (`replica_rows` says which rows a rank takes).
"""
from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from .config import BYTE_VOCAB

VOCAB = BYTE_VOCAB  # bytes (one definition: hal.trainer.config)


class DataError(ValueError):
    """The corpus cannot be built (no files, too small for one window)."""


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def list_files(roots: Sequence[Path], pattern: str) -> list[tuple[Path, str]]:
    """(path, key) of every file, sorted by key; key = path relative to its root (the split hashes it).
    site-packages is skipped under the stdlib (it is not the standard library and differs by machine)."""
    out = []
    for root in roots:
        if root.is_file():
            out.append((root, root.name))
            continue
        if not root.is_dir():
            raise DataError(f"data path {root}: no such file or directory")
        for p in root.rglob(pattern):
            rel = p.relative_to(root).as_posix()
            if p.is_file() and "site-packages" not in rel and "__pycache__" not in rel:
                out.append((p, rel))
    return sorted(out, key=lambda t: t[1])


def _is_val(key: str, fraction: float) -> bool:
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")
    return (h % 1_000_000) < fraction * 1_000_000


@dataclass
class Corpus:
    """Train and validation bytes (uint8 tensors) and where they came from."""

    train: torch.Tensor
    val: torch.Tensor
    files: int
    source: str

    @classmethod
    def build(cls, roots: Sequence[Path], pattern: str, max_bytes: int, val_fraction: float,
              source: str) -> "Corpus":
        train, val, used, total = [], [], 0, 0
        for path, key in list_files(roots, pattern):
            if total >= max_bytes:
                break
            data = path.read_bytes()[: max_bytes - total]
            total += len(data)
            used += 1
            (val if _is_val(key, val_fraction) else train).append(data)
        if not train or not val:
            raise DataError(f"{source}: {used} files, {total} bytes: too few for a train/validation split "
                            f"(train {len(train)} files, validation {len(val)})")
        t = torch.frombuffer(bytearray(b"".join(train)), dtype=torch.uint8)
        v = torch.frombuffer(bytearray(b"".join(val)), dtype=torch.uint8)
        return cls(t, v, used, source)

    @classmethod
    def from_config(cls, cfg) -> "Corpus":
        d = cfg.data
        if d.source == "stdlib":
            roots, source = [stdlib_dir()], f"Python standard library ({stdlib_dir()}, {d.glob})"
        else:
            roots = [cfg.resolve(p) for p in d.paths]
            source = f"files {', '.join(map(str, roots))} ({d.glob})"
        return cls.build(roots, d.glob, d.max_bytes, d.val_fraction, source)


def _windows(data: torch.Tensor, rows: int, seq: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    if data.numel() < seq + 2:
        raise DataError(f"corpus part of {data.numel()} bytes is shorter than one window of {seq + 1}")
    starts = torch.randint(0, data.numel() - seq - 1, (rows,), generator=gen)
    idx = starts[:, None] + torch.arange(seq + 1)[None, :]  # (rows, seq + 1)
    w = data[idx].long()
    return w[:, :-1].contiguous(), w[:, 1:].contiguous()  # (rows, seq) each


def train_batch(corpus: Corpus, seed: int, step: int, global_batch: int, seq: int):
    """(inputs, targets), each (global_batch, seq) int64: the global batch of `step`, a pure function
    of (seed, step)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return _windows(corpus.train, global_batch, seq, gen)


def val_batches(corpus: Corpus, seed: int, count: int, global_batch: int, seq: int):
    """The fixed validation batches (the same at every evaluation)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 - 1)
    return [_windows(corpus.val, global_batch, seq, gen) for _ in range(count)]


def replica_rows(plan, rank: int) -> list[tuple[int, int]]:
    """Rows [lo, hi) of the global batch that `rank`'s first stage reads, one range per micro-batch
    (the cut hal.strategies.apply.AppliedPlan._rows makes); [] for a rank the plan leaves idle."""
    if rank not in plan.ranks:
        return []
    role = plan.roles(rank)[0]  # the first stage this rank holds
    lo, hi = plan.rows(role.stage, role.replica)
    mb = plan.microbatch_size
    return [(m * mb + lo, m * mb + hi) for m in range(plan.num_microbatches)]
