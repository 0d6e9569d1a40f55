"""Checkpoints that cannot lie: a content digest of every file of a `hal train` checkpoint, written with it
and checked before it is loaded, and `hal train --check-checkpoints DIR`.

torch's DCP (torch 2.13, torch/distributed/checkpoint) has no content check of its own: `.metadata`
records each entry's file, offset and length, nothing of the bytes (no checksum in metadata.py,
filesystem.py or the storage writer's options), so flipped bytes in a shard load silently. Here, once a
save has completed (DCP's coordinator has written `.metadata` after every rank's data; for an async save
in its done-callback, off the training loop), rank 0 reads every file of the step folder and writes
`manifest.json` ({file: {bytes, sha256}}, atomically: temporary file + rename) and only then the
`.complete` marker (hal.trainer.checkpoint). Reading the whole checkpoint once on rank 0 is the price of
one digest pass; verifying is shared: each rank checks every world-th file (`verify`), and the verdicts
are gathered on the checkpoint group (bounded by the run's timeout) before anything is loaded.

A step folder is one of:
  ok           `.complete` and every file as the manifest says (a folder written before manifests
               existed: `.complete`, `.metadata` readable and every file it names present and long enough)
  incomplete   no `.complete` marker: the save did not finish (a resume skips it without a word)
  corrupt      `.complete`, but a file is missing, of another length, or its sha256 differs (or the
               manifest / `.metadata` cannot be read): the reason names the file
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

MANIFEST = "manifest.json"
MARK = ".complete"  # hal.trainer.checkpoint.MARK is this
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Problem:
    """Why a checkpoint cannot be trusted: the file and the reason."""

    file: str
    reason: str

    def __str__(self) -> str:
        return f"{self.file}: {self.reason}"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(step_path: Path) -> dict:
    """Digest every file of a finished save (all but the marker and the manifest) into manifest.json."""
    files = {p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
             for p in sorted(step_path.iterdir()) if p.is_file() and p.name not in (MARK, MANIFEST)
             and ".tmp" not in p.name}
    tmp = step_path / (MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"version": 1, "algorithm": "sha256", "files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, step_path / MANIFEST)
    return files


def read_manifest(step_path: Path) -> tuple[Optional[dict], Optional[Problem]]:
    """(files, None), (None, None) when the folder has no manifest, or (None, problem)."""
    p = step_path / MANIFEST
    if not p.is_file():
        return None, None
    try:
        files = json.loads(p.read_text())["files"]
        if not isinstance(files, dict) or not files:
            raise ValueError("no files listed")
        return files, None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, Problem(MANIFEST, f"cannot be read ({type(exc).__name__}: {exc})")


def _check_file(step_path: Path, name: str, want: dict) -> Optional[Problem]:
    p = step_path / name
    if not p.is_file():
        return Problem(name, "missing")
    size = p.stat().st_size
    if size != want.get("bytes"):
        return Problem(name, f"{size} bytes, the manifest says {want.get('bytes')} (truncated or rewritten)")
    if sha256_file(p) != want.get("sha256"):
        return Problem(name, "content differs from the manifest's sha256 (bytes changed after the save)")
    return None


def _check_structure(step_path: Path) -> Optional[Problem]:
    """A checkpoint without a manifest (written before digests): `.metadata` readable and every file it
    names present and long enough for its entries (the bytes themselves cannot be checked)."""
    from torch.distributed.checkpoint import FileSystemReader
    try:
        md = FileSystemReader(str(step_path)).read_metadata()
    except Exception as exc:  # noqa: BLE001 - an unreadable .metadata, whatever the unpickler raised
        return Problem(".metadata", f"cannot be read ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})")
    need: dict[str, int] = {}
    for info in (md.storage_data or {}).values():
        need[info.relative_path] = max(need.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(need.items()):
        p = step_path / name
        if not p.is_file():
            return Problem(name, "missing")
        if p.stat().st_size < end:
            return Problem(name, f"{p.stat().st_size} bytes, its entries end at byte {end} (truncated)")
    return None


def verify(step_path: Path, share: tuple[int, int] = (0, 1)) -> Optional[Problem]:
    """The first problem of a complete checkpoint folder in this caller's share of its files (`share` =
    (rank, world): files rank, rank + world, ...), None when it passes."""
    files, problem = read_manifest(step_path)
    if problem is not None:
        return problem
    if files is None:
        return _check_structure(step_path) if share[0] == 0 else None
    for i, name in enumerate(sorted(files)):
        if i % share[1] == share[0]:
            problem = _check_file(step_path, name, files[name])
            if problem is not None:
                return problem
    return None


# ---- hal train --check-checkpoints DIR -------------------------------------------------------------
def step_folders(root: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every `step_<N>` folder under `root`, newest first."""
    found = [(int(p.name[5:]), p) for p in root.glob("step_*") if p.is_dir() and p.name[5:].isdigit()]
    return sorted(found, reverse=True)


def state_of(path: Path) -> tuple[str, str]:
    """(ok | incomplete | corrupt, detail) of one step folder."""
    if not (path / MARK).is_file():
        return "incomplete", "no .complete marker: the save did not finish"
    problem = verify(path)
    if problem is not None:
        return "corrupt", str(problem)
    files, _ = read_manifest(path)
    return "ok", (f"{len(files)} files match their sha256" if files is not None
                  else "no manifest (written before digests): structure checked, content not")


def check_command(directory: str) -> int:
    """Print each step's state; 0 when the newest complete checkpoint is good, 1 otherwise, 2 when
    `directory` is no checkpoint folder (a run folder's checkpoints/ is taken too)."""
    root = Path(directory).expanduser()
    if root.is_dir() and not step_folders(root) and step_folders(root / "checkpoints"):
        root = root / "checkpoints"
    if not root.is_dir():
        print(f"hal train: error: --check-checkpoints {directory}: no such folder", file=sys.stderr)
        return 2
    steps = step_folders(root)
    if not steps:
        print(f"hal train: error: --check-checkpoints {directory}: no step_<N> checkpoint folders in it "
              f"(nor in its checkpoints/)", file=sys.stderr)
        return 2
    newest_complete: Optional[str] = None
    for step, path in steps:
        state, detail = state_of(path)
        if newest_complete is None and state != "incomplete":
            newest_complete = state
        print(f"step {step:>8}  {state:<10}  {path}  ({detail})")
    good = newest_complete == "ok"
    print(f"hal train: the newest complete checkpoint in {root} is "
          + ("good" if good else "corrupt" if newest_complete else "missing (no complete checkpoint)"))
    return 0 if good else 1
