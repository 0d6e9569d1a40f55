"""Training precision per chip kind: which compute dtype each rank runs in, the FSDP2 policy and the
autocast context that give it, and dynamic loss scaling for float16.

    dtype = resolve_dtype("auto", accelerator.profile, rank, chip)   # 'bfloat16' / 'float16' / 'float32'
    prec = Precision(every_ranks_dtype, rank)                         # the same list on every rank
    run = apply_plan(model, plan, precision=prec, ...)
    scaler = LossScaler() if prec.loss_scaling else None

Rules (issue 23, item 4):
- master weights, gradients and optimizer state stay float32 on every rank; compute runs in the rank's
  dtype: torch.autocast around each stage's forward (DDP, TP, pipeline stages), and for ZeRO stages
  FSDP2's MixedPrecisionPolicy(param_dtype=<dtype>, reduce_dtype=float32) when every rank of the
  stage's DP group computes in the same dtype (its all-gather then moves 16-bit weights); a DP group
  that mixes dtypes gathers float32 and each rank casts under autocast, so no chip is handed a dtype
  it lacks;
- gradients are reduced in float32 everywhere (DDP buckets of float32 gradients, FSDP2's reduce_dtype)
  and activations cross a stage boundary in float32 (the model's dtype), so the bridge between chip
  kinds only ever carries float32;
- `precision = "auto"`: bfloat16 on a chip whose profile lists bfloat16, float16 on one that lists
  only float16 (Ascend 910A), float32 otherwise; an explicit dtype a chip's profile lacks is a
  PrecisionError naming rank, chip and dtype;
- float16 anywhere in the world turns on one dynamic loss scale for the whole world (torch.amp.
  GradScaler's semantics: scale the loss, unscale the gradients, skip the step and halve the scale on
  an overflow, double it after `growth_interval` clean steps). Every rank scales by the same factor,
  so the float32 gradient sum over ranks of different dtypes stays one scaled sum; the overflow verdict
  is agreed with one bounded all_reduce (MAX) so every rank skips the same steps.
On emulated chips the dtypes are the host CPU's (torch's CPU autocast): the arithmetic is real, the
chip's speed in that dtype is not (timed emulation, hal.emulation.timed, charges each op at the catalog rate of the
dtype it computes in).
"""
from __future__ import annotations

import math

from contextlib import nullcontext
from datetime import timedelta
from typing import Any, ContextManager, Iterable, Optional, Sequence

import torch
import torch.distributed as dist

from hal.contract.errors import HalError

PRECISIONS = ("fp32", "bf16", "fp16", "auto")
_DTYPE_OF = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
_TORCH = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class PrecisionError(HalError, ValueError):
    """A precision a rank cannot train in (names rank, chip and dtype) or a failed loss-scale agreement."""


def chip_dtypes(profile: Any) -> set[str]:
    """The dtype keys a chip profile lists (a listed figure may be unknown; listed = the chip has it)."""
    return set(getattr(profile, "peak_flops", {}) or {})


def resolve_dtype(requested: str, profile: Any, rank: int, chip: str) -> str:
    """The compute dtype ('float32', 'bfloat16', 'float16') of `rank` on `chip` with `profile` for a
    requested precision (PRECISIONS). PrecisionError if the profile lacks an explicitly asked dtype."""
    if requested not in PRECISIONS:
        raise PrecisionError(f"precision = {requested!r}; expected one of {PRECISIONS}")
    has = chip_dtypes(profile)
    model = getattr(profile, "model", "?")
    if requested == "auto":
        return next((d for d in ("bfloat16", "float16") if d in has), "float32")
    want = _DTYPE_OF[requested]
    if want != "float32" and want not in has:
        raise PrecisionError(f"rank {rank}: chip {chip!r} ({model}) has no {want} (its profile lists "
                             f"{sorted(has)}); precision = {requested!r} would hand it a dtype it lacks "
                             f"(use precision = 'auto': bfloat16 where a chip has it, float16 with loss "
                             f"scaling where it does not)")
    return want


class Precision:
    """Every rank's compute dtype (the same list on every rank) seen from rank `rank`."""

    def __init__(self, rank_dtypes: Sequence[str], rank: int) -> None:
        bad = [d for d in rank_dtypes if d not in _TORCH]
        if bad or not 0 <= rank < len(rank_dtypes):
            raise PrecisionError(f"Precision: dtypes {list(rank_dtypes)} (each one of {sorted(_TORCH)}), "
                                 f"rank {rank} of {len(rank_dtypes)}")
        self.rank_dtypes, self.rank = tuple(rank_dtypes), rank

    @property
    def compute_dtype(self) -> torch.dtype:
        return _TORCH[self.rank_dtypes[self.rank]]

    @property
    def loss_scaling(self) -> bool:
        """True when any rank computes in float16 (then the whole world scales its loss)."""
        return "float16" in self.rank_dtypes

    def autocast(self, device_type: str) -> ContextManager:
        """torch.autocast in this rank's dtype (nothing for float32)."""
        if self.compute_dtype == torch.float32:
            return nullcontext()
        return torch.autocast(device_type=device_type, dtype=self.compute_dtype)

    def group_dtype(self, ranks: Iterable[int]) -> Optional[torch.dtype]:
        """The 16-bit dtype every rank of `ranks` computes in, or None (float32, or a mix)."""
        kinds = {self.rank_dtypes[r] for r in ranks}
        return _TORCH[kinds.pop()] if len(kinds) == 1 and kinds != {"float32"} else None

    def fsdp_policy(self, ranks: Iterable[int]):
        """FSDP2's MixedPrecisionPolicy for a DP group: 16-bit all-gather when the group agrees, float32
        gradient reduce-scatter always."""
        from hal.contract.compat import fsdp
        MixedPrecisionPolicy = fsdp().MixedPrecisionPolicy
        return MixedPrecisionPolicy(param_dtype=self.group_dtype(ranks), reduce_dtype=torch.float32)

    def describe(self) -> str:
        kinds = sorted(set(self.rank_dtypes))
        return "/".join(kinds) + (" (float16 ranks: dynamic loss scaling)" if self.loss_scaling else "")


def facts_dtype(chip: str, model: Optional[str]) -> str:
    """The 16-bit dtype the planner prices `chip` (`model`) at: bfloat16, or float16 on a catalogued chip
    whose profile has no bfloat16 (Ascend 910A)."""
    from hal.core import catalog
    try:
        has = chip_dtypes(catalog.profile_for(chip, model))
    except Exception:  # a chip the catalog lacks (cpu, an out-of-tree plugin): the planner's default
        return "bfloat16"
    return "float16" if "bfloat16" not in has and "float16" in has else "bfloat16"


def activation_bytes(requested: str) -> int:
    """Bytes per activation element a run in `requested` precision moves (the planner's dtype_bytes)."""
    return 4 if requested == "fp32" else 2


class LossScaler:
    """Dynamic loss scaling with torch.amp.GradScaler's defaults and update rule, for a whole world of
    ranks (GradScaler itself works on one process's optimizer; here gradients are local shards and
    the skip decision must be global)."""

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000) -> None:
        if not (init_scale > 0 and growth_factor > 1 and 0 < backoff_factor < 1 and growth_interval >= 1):
            raise PrecisionError(f"LossScaler: init_scale={init_scale} > 0, growth_factor={growth_factor} > 1, "
                                 f"0 < backoff_factor={backoff_factor} < 1, growth_interval={growth_interval} >= 1")
        self.scale, self.growth, self.backoff = float(init_scale), growth_factor, backoff_factor
        self.interval = growth_interval
        self.clean_steps = 0
        self.skipped = 0

    def unscale_(self, params: Iterable[torch.nn.Parameter]) -> bool:
        """Divide every gradient by the scale in place; True when any is not finite (this rank)."""
        from torch.distributed.tensor import DTensor
        inv = 1.0 / self.scale
        bad = False
        for p in params:
            g = p.grad
            if g is None:
                continue
            local = g._local_tensor if isinstance(g, DTensor) else g
            local.mul_(inv)
            bad = bad or not bool(torch.isfinite(local).all())
        return bad

    def agree(self, found: bool, group: Optional[dist.ProcessGroup], timeout_s: float, step: int) -> bool:
        """Whether any rank of `group` found a non-finite gradient: one MAX all_reduce, waited at most
        `timeout_s` (PrecisionError naming the step if it does not complete)."""
        flag = torch.tensor([1.0 if found else 0.0])
        work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group, async_op=True)
        try:
            done = work.wait(timeout=timedelta(seconds=timeout_s))
        except RuntimeError as exc:
            raise PrecisionError(f"loss scaling, step {step}: the overflow agreement (all_reduce MAX) did not "
                                 f"complete within {timeout_s:g} s: {exc}") from exc
        if done is False:
            raise PrecisionError(f"loss scaling, step {step}: the overflow agreement did not complete "
                                 f"within {timeout_s:g} s")
        return bool(flag.item() > 0)

    def update(self, overflow: bool) -> None:
        """GradScaler.update: back off on an overflow, grow after `interval` clean steps."""
        if overflow:
            self.scale *= self.backoff
            self.clean_steps = 0
            self.skipped += 1
            return
        self.clean_steps += 1
        if self.clean_steps == self.interval:
            self.scale *= self.growth
            self.clean_steps = 0

    def step(self, params: Sequence[torch.nn.Parameter], group: Optional[dist.ProcessGroup], timeout_s: float,
             step: int) -> bool:
        """After backward: unscale, agree on overflow over `group`, update the scale. Returns True when the
        optimizer may step (False: every rank skips this step; its gradients are dropped here)."""
        overflow = self.agree(self.unscale_(params), group, timeout_s, step)
        self.update(overflow)
        if overflow:
            for p in params:
                p.grad = None
        return not overflow

    def state_dict(self) -> dict:
        return {"scale": self.scale, "clean_steps": self.clean_steps, "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a checkpoint's `state_dict()` (the trainer stores it beside the data position), so a
        resumed float16 run scales as the uninterrupted one would (GradScaler.load_state_dict's role)."""
        scale, clean, skipped = state.get("scale"), state.get("clean_steps"), state.get("skipped", 0)
        if not (isinstance(scale, (int, float)) and not isinstance(scale, bool) and math.isfinite(scale) and scale > 0):
            raise PrecisionError(f"LossScaler.load_state_dict: scale = {scale!r}: not a finite number > 0")
        for name, value in (("clean_steps", clean), ("skipped", skipped)):
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
                raise PrecisionError(f"LossScaler.load_state_dict: {name} = {value!r}: not an integer >= 0")
        self.scale, self.clean_steps, self.skipped = float(scale), clean, skipped
