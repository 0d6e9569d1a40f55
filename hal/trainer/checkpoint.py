"""Checkpoints of a `hal train` run with torch.distributed.checkpoint (DCP), plan-independent so they
reshard: written by one cluster shape and plan, loaded by another.

What is saved, under `<dir>/step_<N>/`:
- `model.<fqn>`: every parameter by the FULL model's own name (`embed.weight`, `blocks.3.attn.wq.weight`,
  `blocks.1.moe.experts.5.w1.weight`), whatever the plan: stage modules keep the model's attribute names
  (hal.strategies.apply.StageModule), the parts a rank holds are gathered into one container (several stages
  per rank, an interleaved schedule, included), and torch's `get_state_dict` unwraps DDP. A DP-replicated
  parameter is a plain tensor written once (DCP de-duplicates equal keys); an FSDP2 or TP shard is a
  DTensor whose global shape and offsets DCP records. Expert parameters are keyed by global expert id.
- `optim.state.<fqn>.{step,exp_avg,exp_avg_sq}` and `optim.param_groups.<fqn>.<hyper>`: AdamW's state in
  torch's *flattened* form (`StateDictOptions(flatten_optimizer_state_dict=True)`, what torchtitan uses for
  pipeline parallel), so each rank reads exactly the entries of the parameters it now holds.
- `rng.rank<R>`: each rank's CPU RNG state, and `meta.json` (step, world, plan, each rank's chip, written by
  rank 0). The lr schedule and the data position are pure functions of the step (hal.trainer.config.lr_at,
  hal.trainer.data.train_batch), so the step restores both.

Loading builds this rank's state dict for the NEW layout and lets `dcp.load` fill it: DCP reads, for every
key, the slices the new shard needs from whatever the old ranks wrote - that is the resharding; no code here
moves tensors between layouts. The RNG is restored only when world size and plan are unchanged (otherwise
rank r of the new job has no counterpart; nothing in training draws from it: data and init are seeded).

Saves are asynchronous (`dcp.async_save`, torch 2.13: state_dict_saver.async_save: the state is deep-copied
to CPU memory at the call - DefaultStager - then written by a background thread), on a dedicated gloo group
(the background thread's collectives must not interleave with the training loop's own). At most one save is
in flight: the next save, the end of the run and `close()` wait for it. The checkpoint is marked complete
(`.complete`) by rank 0 when its save future resolves: DCP's coordinator (rank 0) writes `.metadata` only
after gathering every rank's write results, so a run killed mid-save leaves no mark and resumes from the
previous checkpoint. Before the mark, rank 0 writes `manifest.json`, the sha256 of every file
(hal.trainer.integrity); a save refuses a non-finite model (hal.trainer.nonfinite).

Resume takes the newest complete checkpoint that passes its digests (every rank checks a share of its files;
the verdicts are gathered); one that fails, or that DCP cannot read, is reported in one warning line (path,
file, reason) and the next older one is tried. A checkpoint this run's layout cannot take (another model
size) is one `CheckpointError` naming the entries and their shapes, before DCP reads anything.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from hal.contract.errors import HalError

from .integrity import MARK, Problem, verify, write_manifest
from .nonfinite import check_params_before_save

log = logging.getLogger(__name__)
META = "meta.json"
_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


class CheckpointError(HalError):
    """A checkpoint that cannot be loaded into this run (missing model entries, wrong shapes); the message
    names the checkpoint and the keys."""


class UnreadableCheckpoint(CheckpointError):
    """DCP could not read a checkpoint that passed its digests (resume falls back to an older one)."""


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def complete_steps(root: Path) -> list[int]:
    """Steps of the complete checkpoints under `root` (`.complete` marker present), newest first."""
    if not root.is_dir():
        return []
    return sorted((int(p.name[5:]) for p in root.glob("step_*") if p.name[5:].isdigit() and (p / MARK).is_file()),
                  reverse=True)


def latest(root: Path) -> Optional[int]:
    """The step of the newest complete checkpoint under `root`, None when there is none."""
    steps = complete_steps(root)
    return steps[0] if steps else None


def read_meta(root: Path, step: int) -> dict:
    try:
        return json.loads((step_dir(root, step) / META).read_text())
    except (OSError, ValueError):
        return {}


class _Parts(nn.Module):
    """The stage modules this rank holds as ONE module whose parameter names are the full model's:
    `embed`, `blocks.<global index>`, `norm`, `head` taken from each part (DDP's wrapper removed; FSDP2's
    fully_shard and TP leave the modules in place, their parameters DTensors). A container, not a copy:
    the parameters are the training ones."""

    def __init__(self, modules: dict[int, nn.Module]) -> None:
        super().__init__()
        self.blocks = nn.ModuleDict()
        for s in sorted(modules):
            inner = getattr(modules[s], "module", modules[s])  # DDP keeps the stage in .module
            for name in ("embed", "norm", "head"):
                sub = getattr(inner, name, None)
                if sub is not None:
                    setattr(self, name, sub)
            for i, block in inner.blocks.items():
                self.blocks[i] = block


@dataclass
class Resumed:
    """What `Checkpointer.resume` restored."""

    step: int
    path: Path
    resharded: bool  # the plan or world differs from the one that wrote it
    saved_world: Optional[int]
    saved_plan: Optional[dict]
    load_s: float
    meta: dict = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # newer checkpoints not trusted: "path (file: reason)"


class Checkpointer:
    """Save and load one run's checkpoints (collective: every rank of the world builds it, then calls
    `resume`, `save` and `close` at the same points)."""

    def __init__(self, root: Path, run: Any, opt: Optional[torch.optim.Optimizer], plan: Any, chips: list,
                 timeout_s: float, use_async: bool = True, attempt: int = 0) -> None:
        self.root, self.run, self.opt, self.plan, self.chips = root, run, opt, plan, chips
        self.use_async, self.attempt = use_async, attempt
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        # its own gloo group: an async save's collectives run in a background thread, and must not share
        # a group (an op sequence) with the loop's bookkeeping collectives
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        self.parts = _Parts(run.modules) if run.modules else None
        self._pending: Optional[Future] = None
        self._pending_step: Optional[int] = None
        self._mark_lock = threading.Lock()  # the async done-callback and wait() may both complete a save
        self.saved: list[dict] = []  # step, blocking seconds (what the loop waited), async or not

    # ---- state ---------------------------------------------------------------------------------
    def _state(self) -> dict:
        state: dict = {f"rng.rank{self.rank}": torch.get_rng_state()}
        if self.parts is not None:
            if self.opt is None:
                raise CheckpointError(f"rank {self.rank} holds stages {sorted(self.run.modules)} but no optimizer")
            model_sd, optim_sd = get_state_dict(self.parts, self.opt, options=_OPTIONS)
            state.update({f"model.{k}": v for k, v in model_sd.items()})
            state.update({f"optim.{k}": v for k, v in optim_sd.items()})
        return state

    # ---- save ----------------------------------------------------------------------------------
    def save(self, step: int, final: bool = False) -> Path:
        """Write step `step`'s checkpoint (collective). Asynchronous unless `final` or async is off:
        returns once the state is copied to CPU memory; `.complete` appears when the write finished."""
        t0 = time.perf_counter()
        self.wait()
        path = step_dir(self.root, step)
        if self.rank == 0:
            path.mkdir(parents=True, exist_ok=True)
            (path / MARK).unlink(missing_ok=True)  # a stale mark of an overwritten, unfinished save
            (path / META).write_text(json.dumps({
                "step": step, "world": self.world, "plan": json.loads(self.plan.to_json()),
                "chips": [{"rank": c["rank"], "chip": c["chip"], "emulated": c["emulated"]} for c in self.chips],
                "attempt": self.attempt, "time": time.time()}, indent=1) + "\n")
        dist.barrier(group=self.group)
        check_params_before_save(list(self.parts.named_parameters()) if self.parts is not None else [], step,
                                 self.group)
        state = self._state()
        state["step"] = torch.tensor(step)
        if self.use_async and not final:
            fut = dcp.async_save(state, checkpoint_id=str(path), process_group=self.group)
            if self.rank == 0:
                fut.add_done_callback(lambda f, p=path, s=step: self._complete(p, s) if f.exception() is None
                                      else None)
            self._pending, self._pending_step = fut, step
        else:
            dcp.save(state, checkpoint_id=str(path), process_group=self.group)
            if self.rank == 0:
                self._complete(path, step)
            dist.barrier(group=self.group)
        self.saved.append({"step": step, "blocking_s": time.perf_counter() - t0,
                           "async": bool(self.use_async and not final)})
        return path

    def wait(self) -> None:
        """Wait for the save in flight (if any); its errors are raised here."""
        if self._pending is not None:
            fut, self._pending = self._pending, None
            fut.result()
            step = self._pending_step
            if self.rank == 0 and step is not None:  # the done-callback completes it; make sure it has
                self._complete(step_dir(self.root, step), step)

    def _complete(self, path: Path, step: int) -> None:
        """rank 0, once DCP's coordinator has written `.metadata` after every rank's data: the manifest
        (every file's sha256), then the `.complete` mark (once, whichever thread comes first)."""
        with self._mark_lock:
            if not (path / MARK).is_file():
                write_manifest(path)
                (path / MARK).write_text(f"{step}\n")

    def close(self) -> None:
        self.wait()

    # ---- load ----------------------------------------------------------------------------------
    def resume(self) -> Optional[Resumed]:
        """Load the newest complete checkpoint that passes its digests (and DCP can read) into this run's
        layout (collective); None when there is none. Each one skipped is one warning line."""
        skipped: list[str] = []
        for step in complete_steps(self.root):
            path = step_dir(self.root, step)
            problem = self._verified(path)
            if problem is None:
                try:
                    resumed = self.load(step)
                except UnreadableCheckpoint as exc:
                    problem = Problem("DCP", str(exc).split(": ", 1)[-1])
                else:
                    resumed.skipped = skipped
                    return resumed
            skipped.append(f"{path} ({problem})")
            if self.rank == 0:
                log.warning(f"hal train: WARNING: checkpoint {path} is not trusted ({problem}); falling back to "
                            f"the newest older checkpoint that passes its digests")
        if skipped:
            raise CheckpointError(f"no checkpoint under {self.root} passes its digests: {'; '.join(skipped)}; "
                                  f"move them away (or set checkpoint.resume = false) to train from step 0")
        return None

    def _verified(self, path: Path) -> Optional[Problem]:
        """Collective: the first problem any rank found in its share of the checkpoint's files."""
        mine = verify(path, (self.rank, self.world))
        found: list = [None] * self.world
        dist.all_gather_object(found, None if mine is None else (mine.file, mine.reason), group=self.group)
        first = next((f for f in found if f is not None), None)
        return None if first is None else Problem(*first)

    def _mismatch(self, path: Path, state: dict, stored: dict) -> None:
        """Collective: a CheckpointError on every rank when any rank's layout needs model entries the
        checkpoint lacks or holds with another shape (another model config), naming them."""
        missing = sorted(k for k in state if k.startswith("model.") and k not in stored)
        shapes = [f"{k} {list(stored[k].size)} in the checkpoint, {list(v.shape)} here" for k, v in state.items()
                  if isinstance(v, torch.Tensor) and k in stored and hasattr(stored[k], "size")
                  and tuple(stored[k].size) != tuple(v.shape)]
        mine = None
        if missing:
            mine = (f"rank {self.rank} needs {len(missing)} model entries the checkpoint does not hold, e.g. "
                    f"{missing[:3]} (a different model config?)")
        elif shapes:
            mine = (f"rank {self.rank}: {len(shapes)} entries of another shape (a different model config?), e.g. "
                    f"{'; '.join(shapes[:3])}")
        found: list = [None] * self.world
        dist.all_gather_object(found, mine, group=self.group)
        first = next((f for f in found if f is not None), None)
        if first is not None:
            raise CheckpointError(f"checkpoint {path}: {first}")

    def load(self, step: int) -> Resumed:
        """Load step `step` into this run's layout (collective). CheckpointError when the layout cannot take
        it; UnreadableCheckpoint when DCP cannot read it."""
        t0 = time.perf_counter()
        path = step_dir(self.root, step)
        meta = read_meta(self.root, step)
        saved_plan, saved_world = meta.get("plan"), meta.get("world")
        same = saved_world == self.world and saved_plan == json.loads(self.plan.to_json())
        state = self._state()
        state["step"] = torch.tensor(-1)
        unreadable: Optional[str] = None
        try:
            stored = dict(dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata)
        except Exception as exc:  # noqa: BLE001 - whatever the unpickler raised: the file is unreadable
            stored, unreadable = {}, f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        found: list = [None] * self.world
        dist.all_gather_object(found, unreadable, group=self.group)
        if any(found):
            raise UnreadableCheckpoint(f"checkpoint {path}: .metadata: {next(f for f in found if f)}")
        self._mismatch(path, state, stored)
        rng_key = f"rng.rank{self.rank}"
        # the optimizer may lack entries for parameters that never had a gradient when it was written
        # (an expert no token reached): those keep the fresh state; the RNG only when the layout is unchanged
        want = {k: v for k, v in state.items() if k in stored and (k != rng_key or same)}
        try:
            dcp.load(want, checkpoint_id=str(path), process_group=self.group)
        except Exception as exc:  # noqa: BLE001 - DCP gathers every rank's failure into one exception
            text = " ".join(str(exc).split())
            raise UnreadableCheckpoint(f"checkpoint {path}: DCP cannot read it: {type(exc).__name__}: "
                                       f"{text[:300]}") from exc
        if self.parts is not None:
            hyper = [{k: v for k, v in g.items() if k != "params"} for g in self.opt.param_groups]
            model_sd = {k[6:]: v for k, v in want.items() if k.startswith("model.")}
            optim_sd = {k[6:]: v for k, v in want.items() if k.startswith("optim.")}
            set_state_dict(self.parts, self.opt, model_state_dict=model_sd, optim_state_dict=optim_sd,
                           options=_OPTIONS)
            for g, h in zip(self.opt.param_groups, hyper):  # lr comes from the step; keep what a load left out
                for k, v in h.items():
                    g.setdefault(k, v)
        if rng_key in want:
            torch.set_rng_state(want[rng_key])
        dist.barrier(group=self.group)
        return Resumed(int(want["step"]), path, not same, saved_world, saved_plan, time.perf_counter() - t0, meta)
