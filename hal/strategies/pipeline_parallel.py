"""Pipeline parallelism with uneven stages: layers per stage, chip kind, DP and TP degree all set by the
plan, activations re-sliced between stages of different DP degree; plus torch's own schedules where
the layout is a set of equal chains.

Two runtimes, one `step(inputs, targets)` shape:

* `HeteroPipeline` (any layout a Plan allows, 1F1B or GPipe order). Each micro-batch's rows are split
  over a stage's DP replicas by the plan (replica j owns rows [a_j, b_j), sizes may differ by chip).
  Across a stage boundary every rank sends to each next-stage replica the rows it owns of that
  replica's range, and gradients come back along the same rows (FlagScale's heterogeneous pipeline
  does the same). The transfers come from `HeteroMesh.transfers`; all are point-to-point on the world
  group (`hetero`): isend (never blocks the schedule) and irecv waited with the group's timeout.
  Each stage runs its forwards and backwards in `hal.strategies.schedule.stage_order`'s order (the
  order the planner's simulator replays); with non-blocking sends 1F1B is deadlock-free for any DP
  degree per stage.
* `TorchPipeline` (every stage has the same DP and TP degree and row ranges, so replica j / TP index t
  of every stage form one chain): torch.distributed.pipelining's PipelineStage and its schedules
  (Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble,
  ScheduleZBVZeroBubble), one chain group per (j, t). Interleaved and zero-bubble schedules need a
  rank to host several stages: plan stage i on chain rank i % pp ("loop") or V order ("v").

Loss convention (torchtitan's): `loss_fn(output, target)` returns this micro-batch's summed loss
divided by the *global* token count, and nothing rescales afterwards (scale_grads=False), so the
gradients summed over micro-batches and DP replicas are exactly those of the single-process model on
the whole global batch with a mean loss.

`build_pipeline` / `pipeline_step` are the simplest use of torch's schedules: one stage per rank of a
group, mean loss (tests/test_bridge_strategies.py).
"""
from __future__ import annotations

import time
from datetime import timedelta
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
                                          ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble)
from torch.distributed.pipelining.schedules import generate_stage_to_rank_mapping

from hal.strategies.mesh import HeteroMesh, MeshError
from hal.strategies.schedule import ORDERED_SCHEDULES, Schedule, stage_order

SCHEDULES = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}
# schedule name -> (torch class, stages per rank > 1?, rank mapping style); every Plan schedule and
# torch's InterleavedZeroBubble, which TorchPipeline runs when asked by name
TORCH_SCHEDULES = {
    Schedule.ONE_F_ONE_B: (Schedule1F1B, False, None),
    Schedule.GPIPE: (ScheduleGPipe, False, None),
    Schedule.INTERLEAVED_1F1B: (ScheduleInterleaved1F1B, True, "loop"),
    "InterleavedZeroBubble": (ScheduleInterleavedZeroBubble, True, "loop"),
    Schedule.ZBV_ZERO_BUBBLE: (ScheduleZBVZeroBubble, True, "v"),
}
HETERO_SCHEDULES = ORDERED_SCHEDULES   # what HeteroPipeline runs


class PipelineError(MeshError):
    """A pipeline cannot be built or run as asked (names the rank, stage, schedule and numbers)."""


# ---- one stage per rank of a group, torch's schedules ------------------------------------------------
def build_pipeline(stage_module: nn.Module, group: dist.ProcessGroup, n_microbatches: int,
                   loss_fn: Callable, schedule: str = "1f1b",
                   device: Optional[torch.device] = None):
    """(PipelineStage, schedule) for this rank: stage index = its rank in `group`."""
    if schedule not in SCHEDULES:
        raise ValueError(f"build_pipeline: schedule={schedule!r}; expected one of {sorted(SCHEDULES)}")
    num_stages = dist.get_world_size(group)
    if n_microbatches < 1:
        raise ValueError(f"build_pipeline: n_microbatches={n_microbatches} must be >= 1")
    stage = PipelineStage(stage_module, dist.get_rank(group), num_stages,
                          device or torch.device("cpu"), group=group)
    return stage, SCHEDULES[schedule](stage, n_microbatches=n_microbatches, loss_fn=loss_fn)


def pipeline_step(stage: PipelineStage, sched, inputs: torch.Tensor, targets: torch.Tensor) -> Optional[torch.Tensor]:
    """One forward+backward over the whole batch; returns the mean loss on the last stage, else None."""
    losses: list = []
    args = (inputs,) if stage.is_first else ()
    kwargs = {"target": targets, "losses": losses} if stage.is_last else {}
    sched.step(*args, **kwargs)
    return torch.stack(losses).mean().detach() if stage.is_last else None


class _DataParallelHooks:
    """What a DDP- or FSDP2-wrapped stage needs around micro-batch backwards (the same handling as
    torch.distributed.pipelining.stage's backward_maybe_with_nosync): sync gradients on the last
    backward only."""

    def __init__(self, module: nn.Module) -> None:
        from hal.contract.compat import fsdp
        FSDPModule = fsdp().FSDPModule
        from torch.nn.parallel import DistributedDataParallel
        self.ddp = module if isinstance(module, DistributedDataParallel) else None
        self.fsdp = module if isinstance(module, FSDPModule) else None

    def forward(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if self.ddp is not None:
            with self.ddp.no_sync():
                return module(x)
        return module(x)

    def backward(self, outputs: torch.Tensor, grad: Optional[torch.Tensor], last: bool) -> None:
        if self.ddp is not None:
            if last:  # torch pipelining's way: arm DDP's reducer for exactly this backward
                self.ddp.reducer.prepare_for_backward(list(torch.nn.parallel.distributed._find_tensors(outputs)))
                torch.autograd.backward(outputs, grad)
            else:
                with self.ddp.no_sync():
                    torch.autograd.backward(outputs, grad)
            return
        if self.fsdp is not None:  # FSDP2 gradient accumulation: reduce-scatter in the last backward
            self.fsdp.set_is_last_backward(last)
            self.fsdp.set_requires_gradient_sync(last)
            self.fsdp.set_reshard_after_backward(last)
        torch.autograd.backward(outputs, grad)


class HeteroPipeline:
    """One stage of an uneven pipeline on this rank (stages may differ in layers, chip, DP, TP).

    `module(x)` maps this stage's input rows to its output rows: ids (rows, seq) on the first stage,
    activations (rows, *feature_shape) after it; the last stage's output goes to `loss_fn`.
    """

    def __init__(self, module: nn.Module, mesh: HeteroMesh, loss_fn: Callable, num_microbatches: int,
                 feature_shape: Sequence[int], dtype: torch.dtype = torch.float32, schedule: str = "1F1B",
                 device: Optional[torch.device] = None) -> None:
        if schedule not in HETERO_SCHEDULES:
            raise PipelineError(f"HeteroPipeline: schedule={schedule!r}; this runtime runs "
                                f"{[str(x) for x in HETERO_SCHEDULES]} (torch's interleaved/zero-bubble schedules need "
                                f"equal chains: TorchPipeline)")
        if num_microbatches < 1:
            raise PipelineError(f"HeteroPipeline: num_microbatches={num_microbatches} must be >= 1")
        self.module, self.mesh, self.loss_fn = module, mesh, loss_fn
        self.M, self.feature_shape, self.dtype = num_microbatches, tuple(feature_shape), dtype
        self.device = device or torch.device("cpu")
        self.role = mesh.role()
        s, S, me = self.role.stage, mesh.num_stages, mesh.rank
        self.is_first, self.is_last = s == 0, s == S - 1
        self.order = stage_order(schedule, s, S, num_microbatches)
        self.recv_fwd = [] if self.is_first else [t for t in mesh.transfers(s - 1) if t.dst == me]
        self.send_fwd = [] if self.is_last else [t for t in mesh.transfers(s) if t.src == me]
        self.recv_bwd = [] if self.is_last else [t for t in mesh.grad_transfers(s) if t.dst == me]
        self.send_bwd = [] if self.is_first else [t for t in mesh.grad_transfers(s - 1) if t.src == me]
        lo, hi = self.role.rows
        for name, pieces in (("activations", self.recv_fwd), ("gradients", self.recv_bwd)):
            covered = sorted((p.start, p.end) for p in pieces)
            if pieces and (covered[0][0] != lo or covered[-1][1] != hi or
                           any(a[1] != b[0] for a, b in zip(covered, covered[1:]))):
                raise PipelineError(f"rank {me} stage {s}: incoming {name} rows {covered} do not tile its "
                                    f"rows [{lo}, {hi})")
        self.hooks = _DataParallelHooks(module)
        self.world = mesh.world
        # wall seconds this rank's thread spent blocked receiving from a neighbouring stage (its pipeline
        # bubble as the host sees it; hal train's metrics read it when timed emulation is off)
        self.recv_wait_s = 0.0

    def _recv(self, pieces, m: int, tag: int) -> torch.Tensor:
        """This replica's rows of micro-batch m, assembled from every sender's piece (waits for all)."""
        lo = self.role.rows[0]
        bufs, works = [], []
        pieces = sorted(pieces, key=lambda p: p.start)
        for p in pieces:
            buf = torch.empty((p.end - p.start, *self.feature_shape), dtype=self.dtype, device=self.device)
            works.append(dist.irecv(buf, src=p.src, group=self.world, tag=tag))
            bufs.append(buf)
        t0 = time.perf_counter()
        for w, p in zip(works, pieces):
            if not w.wait():
                raise PipelineError(f"rank {self.mesh.rank} stage {self.role.stage}: receiving micro-batch "
                                    f"{m} rows from rank {p.src} failed (tag {tag})")
        self.recv_wait_s += time.perf_counter() - t0
        assert sum(b.shape[0] for b in bufs) == self.role.rows[1] - lo
        return torch.cat(bufs) if len(bufs) > 1 else bufs[0]  # (rows, *feature_shape)

    def _send(self, full: torch.Tensor, pieces, tag: int, pending: list) -> None:
        """Post an isend of each receiver's rows of `full`; `pending` keeps them until step() waits."""
        lo = self.role.rows[0]
        for p in pieces:
            chunk = full[p.start - lo:p.end - lo].detach().contiguous()
            pending.append((dist.isend(chunk, dst=p.dst, group=self.world, tag=tag), chunk, p))

    def step(self, inputs: Sequence[torch.Tensor], targets: Sequence[Optional[torch.Tensor]]) -> torch.Tensor:
        """Forward and backward of every micro-batch in schedule order; returns the sum of this rank's
        micro-batch losses (0 off the last stage). inputs[m]: this replica's rows of micro-batch m
        (first stage; ignored elsewhere); targets[m] likewise on the last stage."""
        if self.is_first and len(inputs) != self.M:
            raise PipelineError(f"rank {self.mesh.rank}: {len(inputs)} input micro-batches, plan says {self.M}")
        saved: dict[int, tuple] = {}
        pending: list = []
        total = torch.zeros((), dtype=torch.float32)
        n_back = 0
        for kind, m in self.order:
            if kind == "F":
                if self.is_first:
                    x = inputs[m]
                else:
                    x = self._recv(self.recv_fwd, m, tag=2 * m).requires_grad_()
                out = self.hooks.forward(self.module, x)
                if self.is_last:
                    loss = self.loss_fn(out, targets[m])
                    total = total + loss.detach().float()
                    saved[m] = (x, loss)
                else:
                    if out.shape[1:] != self.feature_shape:
                        raise PipelineError(f"rank {self.mesh.rank} stage {self.role.stage}: output shape "
                                            f"{tuple(out.shape)} does not match feature_shape {self.feature_shape}")
                    self._send(out, self.send_fwd, 2 * m, pending)
                    saved[m] = (x, out)
            else:
                x, out = saved.pop(m)
                n_back += 1
                grad = None if self.is_last else self._recv(self.recv_bwd, m, tag=2 * m + 1)
                hook = None
                if not self.is_first:
                    # Send the input gradient from a hook on x, the moment autograd computes it: on the
                    # last micro-batch DDP/FSDP2 reduce inside backward (their final callback waits for
                    # every bucket), and sending after backward returned would put this stage's whole DP
                    # reduction on the previous stage's critical path (Megatron-LM sends first too).
                    hook = x.register_hook(
                        lambda g, m=m: self._send(g, self.send_bwd, 2 * m + 1, pending))
                self.hooks.backward(out, grad, last=n_back == self.M)
                if hook is not None:
                    hook.remove()
        for w, _, p in pending:
            if not w.wait():
                raise PipelineError(f"rank {self.mesh.rank}: send of rows {p.start}:{p.end} to rank {p.dst} failed")
        return total


def check_torch_layout(mesh: HeteroMesh, schedule: str) -> None:
    """PipelineError unless torch's `schedule` can run the plan: equal chains, and a chain's stages on
    its ranks in the order the schedule assumes (one stage per rank for 1F1B/GPipe; stage i on chain
    rank i mod pp for the looped schedules; the V order for ZBVZeroBubble). Needs no communication, so
    every rank reaches the same verdict before any group is used."""
    if schedule not in TORCH_SCHEDULES:
        raise PipelineError(f"schedule={schedule!r}; torch's schedules here are {[str(x) for x in TORCH_SCHEDULES]}")
    _, multi, style = TORCH_SCHEDULES[schedule]
    chains = mesh.chains()
    if chains is None:
        raise PipelineError(f"schedule {schedule} runs on torch's pipelining, which needs equal chains, but "
                            f"the plan's stages differ in DP/TP degree or row ranges:\n{mesh.describe()}")
    for chain in chains:
        S, ranks = len(chain), sorted(set(chain))
        pp = len(ranks)
        if multi:
            want = generate_stage_to_rank_mapping(pp, S, style=style)
            got = {s: ranks.index(r) for s, r in enumerate(chain)}
            if want != got:
                raise PipelineError(f"schedule {schedule} puts stage i on chain rank {want} ({style} order), "
                                    f"but the plan's chain {chain} gives {got}")
        elif pp != S:
            raise PipelineError(f"schedule {schedule} runs one stage per rank, but chain {chain} hosts "
                                f"{S} stages on {pp} ranks")


class TorchPipeline:
    """torch.distributed.pipelining on this rank's chain (equal DP/TP degree in every stage).

    `modules` maps each plan stage this rank hosts to its module (several for interleaved and
    zero-bubble schedules); `examples(stage)` gives (input, output) tensors of one micro-batch's shape
    and dtype for that stage (static metadata, no inference pass)."""

    def __init__(self, modules: dict[int, nn.Module], mesh: HeteroMesh, loss_fn: Callable,
                 num_microbatches: int, schedule: str = "1F1B", device: Optional[torch.device] = None,
                 timeout: Optional[timedelta] = None,
                 examples: Optional[Callable[[int], tuple[torch.Tensor, torch.Tensor]]] = None) -> None:
        if schedule not in TORCH_SCHEDULES:
            raise PipelineError(f"TorchPipeline: schedule={schedule!r}; expected one of "
                                f"{[str(x) for x in TORCH_SCHEDULES]}")
        cls, multi, _ = TORCH_SCHEDULES[schedule]
        check_torch_layout(mesh, schedule)
        mine = mesh.chain_group(timeout)  # built on every rank by apply_plan first; cached here
        if mine is None:
            raise PipelineError(f"rank {mesh.rank} is in no pipeline chain {mesh.chains()}")
        chain, group = mine
        S = len(chain)
        ranks = sorted(set(chain))
        if sorted(modules) != [s for s, r in enumerate(chain) if r == mesh.rank]:
            raise PipelineError(f"rank {mesh.rank}: modules for stages {sorted(modules)}, chain {chain} "
                                f"puts stages {[s for s, r in enumerate(chain) if r == mesh.rank]} here")
        dev = device or torch.device("cpu")
        self.stages = []
        for s in sorted(modules):
            # static metadata: torch 2.13's dynamic inference runs a real forward/backward on the
            # first step and clears the stray gradients only for FSDP modules (stage.py,
            # _post_metadata_inference_cleanup), so a plain or DDP stage would count one micro-batch twice
            ins, outs = examples(s) if examples is not None else (None, None)
            st = PipelineStage(modules[s], s, S, dev, input_args=ins, output_args=outs, group=group)
            st.stage_index_to_group_rank = {i: ranks.index(r) for i, r in enumerate(chain)}
            self.stages.append(st)
        self.is_first = any(st.is_first for st in self.stages)
        self.is_last = any(st.is_last for st in self.stages)
        self.M = num_microbatches
        self.schedule = cls(self.stages if multi else self.stages[0], n_microbatches=num_microbatches,
                            loss_fn=loss_fn, scale_grads=False)

    def step(self, inputs: Sequence[torch.Tensor], targets: Sequence[Optional[torch.Tensor]]) -> torch.Tensor:
        """Same contract as HeteroPipeline.step (per-micro-batch row lists)."""
        losses: list = []
        args = (torch.cat(list(inputs)),) if self.is_first else ()  # (M * rows, seq): torch re-splits it
        kwargs = {"target": torch.cat(list(targets)), "losses": losses} if self.is_last else {}
        self.schedule.step(*args, **kwargs)
        if not losses:
            return torch.zeros((), dtype=torch.float32)
        return torch.stack([l.detach().float() for l in losses]).sum()
