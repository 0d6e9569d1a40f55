"""Op-level profile of a pipeline stage: the (FLOPs, bytes) of every aten op that one micro-batch's forward,
its backward and one optimizer step run, counted on fake CPU tensors (FakeTensorMode: shapes only, no memory,
no compute) with the formulas `hal.emulation.timed` charges an emulated chip by (torch.utils.flop_counter's
FLOPs; bytes = the op's tensor inputs and outputs, as the host runs them).

With a profile the cost model prices a stage op by op, sum over ops of max(flops / F, bytes / B) (a
roofline per op), instead of (total FLOPs / F + activation bytes / B). The totals cannot tell that a
small layer's matmuls are memory-bound one by one, nor count the elementwise ops (norms, rotary,
SwiGLU, residuals, the loss) and the optimizer's traffic, which set a small layer's time (the
prediction error of both on timed-emulated runs: docs/planner.md, "Prediction error").

    prof = OpProfile(model_cfg)                 # dtype: what the run computes in (float32 on a CPU)
    ModelFacts(model_cfg, dtype_bytes=4, op_profile=prof)    # the cost model then uses it

Scope: hal.strategies.models' GPT (dense) laid out by hal.strategies.apply.StageModule, torch AdamW
(foreach=False, as hal/trainer/loop.py). Tensor parallel is priced as the TP-1 block's ops on 1/t of
the data (sequence-parallel Megatron TP shards every block op t ways; the embedding, final norm, head
and loss stay whole, as apply_plan runs them); TP's own collectives are the cost model's. MoE layers
are not profiled (a routed layer's ops depend on the router's choices): the analytic model prices
them.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class Ops(NamedTuple):
    """(flops, bytes, matrix class) per op, in order (the class: hal.emulation.timed_cost.op_shape)."""

    flops: tuple[float, ...]
    nbytes: tuple[float, ...]
    shapes: tuple = ()

    def seconds(self, flops_per_s: float, bytes_per_s: float, share: float = 1.0, matrix=None) -> float:
        """Sum over ops of hal.emulation.timed.op_cost (max(flops x r / F, bytes / B): the clock's one
        formula, r = rate_factor(op's class, the chip's efficiency matrix); a fused causal SDPA's class
        carries the share of torch's full count its kernel does, about 1/2, as the clock charges it), every
        op shrunk to `share` of its work (a GEMM keeps its TP-1 shape's rate: an approximation under TP)."""
        from hal.emulation.timed import Speeds, op_cost, rate_factor
        sp = Speeds(flops_per_s, bytes_per_s, "")
        shapes = self.shapes or (None,) * len(self.flops)
        return sum(op_cost(f * share * rate_factor(s, matrix), b * share, sp)
                   for f, b, s in zip(self.flops, self.nbytes, shapes))

    def __add__(self, other: "Ops") -> "Ops":  # type: ignore[override]
        return Ops(self.flops + other.flops, self.nbytes + other.nbytes, self.shapes + other.shapes)


class _Count(TorchDispatchMode):
    """Records every op hal.emulation.timed would charge (views, allocations, metadata and collectives are
    free), with hal.emulation.timed's rules and formulas. Not `hal.emulation.timed.record_ops`: its TimedMode
    leaves fake tensors uncharged on purpose (shape propagation inside DTensor is no device work), and the
    profile runs on fake tensors so that it costs no memory or compute at any model size."""

    def __init__(self) -> None:
        super().__init__()
        self.flops: list[float] = []
        self.nbytes: list[float] = []
        self.shapes: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from hal.emulation import timed
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in timed._FREE or func.is_view or func.namespace in ("prim",) or \
                func.namespace in timed._COMM_NAMESPACES or func in timed._SYNC:
            return out
        self.flops.append(float(timed.op_flops(func, args, kwargs, out)))
        self.nbytes.append(float(timed.op_bytes(args, kwargs, out)))
        self.shapes.append(timed.op_shape(func, args, kwargs))
        return out

    def take(self) -> Ops:
        ops = Ops(tuple(self.flops), tuple(self.nbytes), tuple(self.shapes))
        self.flops, self.nbytes, self.shapes = [], [], []
        return ops


class StageOps(NamedTuple):
    fwd: Ops        # one micro-batch's forward (with the loss on the last stage)
    bwd: Ops        # the first micro-batch's backward (recompute's forward included): creates .grad
    opt: Ops        # one AdamW step over the stage's parameters
    bwd_acc: Ops    # a later micro-batch's backward: accumulates into .grad


class OpProfile:
    """Profiles of a model's stages, counted once per (layers, ends, rows, recompute) and cached."""

    def __init__(self, cfg, dtype: torch.dtype = torch.float32) -> None:
        if getattr(cfg, "experts", 0):
            raise ValueError(f"OpProfile: model {cfg.name!r} is MoE ({cfg.experts} experts); its routed ops "
                             f"depend on the router, only dense models are profiled")
        self.cfg, self.dtype = cfg, dtype
        self._cache: dict[tuple, StageOps] = {}

    def stage(self, n_layers: int, first: bool, last: bool, rows: int, recompute: bool = False) -> StageOps:
        key = (n_layers, first, last, rows, recompute)
        if key not in self._cache:
            self._cache[key] = self._profile(*key)
        return self._cache[key]

    def _profile(self, n_layers: int, first: bool, last: bool, rows: int, recompute: bool) -> StageOps:
        from hal.strategies.apply import StageModule
        from hal.strategies.models.data import lm_loss_sum
        from hal.strategies.models.gpt import GPT
        cfg = self.cfg
        if not 0 <= n_layers <= cfg.layers:
            raise ValueError(f"OpProfile: n_layers = {n_layers} outside 0..{cfg.layers}")
        from torch._subclasses.fake_tensor import FakeTensorMode
        small = cfg.model_copy(update={"layers": max(n_layers, 1)})

        def build():
            model = GPT(small)
            if self.dtype != torch.get_default_dtype():   # (fake parameters cannot be swapped by .to)
                model = model.to(self.dtype)
            return StageModule(model, (0, n_layers), first, last, "full" if recompute else "none")
        # forward and backward on fake CPU tensors (shapes only, no memory, no compute), so torch
        # picks the CPU kernels the run picks (the meta device would take SDPA's math path)
        count = _Count()
        with FakeTensorMode(allow_non_fake_inputs=True):
            stage = build()
            if first:
                x = torch.zeros(rows, cfg.seq, dtype=torch.int64)
            else:
                x = torch.empty(rows, cfg.seq, cfg.hidden, dtype=self.dtype).requires_grad_()
            targets = torch.zeros(rows, cfg.seq, dtype=torch.int64)

            def forward() -> tuple:
                out = stage(x)
                return out, (lm_loss_sum(out, targets) / 1000.0 if last else None)

            def backward(out, loss) -> None:
                if last:
                    loss.backward()
                else:
                    out.backward(torch.empty_like(out))

            with count:
                out, loss = forward()
            fwd = count.take()
            with count:
                backward(out, loss)
            bwd = count.take()
            # a later micro-batch's backward adds into the gradients the first one created
            out, loss = forward()
            count.take()
            with count:
                backward(out, loss)
            bwd_acc = count.take()
        # the optimizer on the meta device (its step counters stay real CPU scalars, which it reads)
        with torch.device("meta"):
            stage = build()
        params = list(stage.parameters())
        for p in params:
            p.grad = torch.empty_like(p)
        opt = torch.optim.AdamW(params, lr=1e-4, foreach=False)
        opt.step()            # the first step creates the moments; a step in the measured run is the second
        with count:
            opt.step()
        return StageOps(fwd, bwd, count.take(), bwd_acc)


def stage_seconds(prof: OpProfile, flops_per_s: float, bytes_per_s: float, tp: int, n_layers: int, first: bool,
                  last: bool, rows: int, recompute: bool, matrix=None) -> tuple[float, float, float, float]:
    """(forward, first backward, optimizer, a later backward's extra for accumulating gradients)
    seconds of one TP rank of a replica: the blocks' ops on 1/tp of the data, the ends (embedding;
    final norm, head and loss) whole; each op rated by the chip's efficiency `matrix`."""
    blocks = prof.stage(n_layers, False, False, rows, recompute) if n_layers else None
    ends = prof.stage(0, first, last, rows) if (first or last) else None
    relayout = sp_relayout_seconds(prof, bytes_per_s, tp, n_layers, rows, recompute)
    out = []
    for part in ("fwd", "bwd", "opt", "bwd_acc"):
        t = 0.0
        if blocks is not None:
            t += getattr(blocks, part).seconds(flops_per_s, bytes_per_s, 1.0 / tp, matrix)
        if ends is not None:
            t += getattr(ends, part).seconds(flops_per_s, bytes_per_s, 1.0, matrix)
        out.append(t + relayout.get(part, 0.0))
    return out[0], out[1], out[2], out[3] - out[1]


def sp_relayout_seconds(prof: OpProfile, bytes_per_s: float, tp: int, n_layers: int, rows: int,
                        recompute: bool) -> dict[str, float]:
    """Seconds of the copies sequence-parallel TP adds on each TP rank (hal/strategies/tensor_parallel.py's
    block_plan on DTensor): a sequence all-gather / reduce-scatter on dim 1 of a (rows, seq, hidden)
    activation is a dim-0 collective plus a `cat` of the chunks (torch.distributed._functional_collectives:
    all_gather_tensor / reduce_scatter_tensor with gather/scatter dim != 0), which reads and writes
    the whole activation. Per block 4 forward (all-gather before attention and before the MLP,
    reduce-scatter after each) and 4 backward (their adjoints); per stage one more each way (the
    stage's output gathered whole for the next stage; its input gradient gathered whole). Recompute
    repeats the forward's in backward. Counted on timed-emulated TP2 runs: 18-19 `cat`s per
    micro-batch for 2 blocks (benchmarks/planner_prediction.py)."""
    if tp <= 1 or n_layers == 0:
        return {}
    itemsize = torch.empty((), dtype=prof.dtype).element_size()
    one = 2 * rows * prof.cfg.seq * prof.cfg.hidden * itemsize / bytes_per_s   # read chunks + write whole
    fwd = (4 * n_layers + 1) * one
    bwd = (4 * n_layers + 1) * one + (fwd if recompute else 0.0)
    return {"fwd": fwd, "bwd": bwd, "bwd_acc": bwd}
