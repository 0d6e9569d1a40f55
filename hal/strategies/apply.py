"""`apply_plan(model, plan)`: lay one model out over a (mixed) cluster as a Plan says - pipeline stages
(uneven layers, DP and TP degree per stage), data parallel or FSDP2 inside each stage, tensor
parallel inside each replica, expert parallel over each stage's DP group - and hand the training loop
what it needs: this rank's stage module(s), the parameters for its optimizer, and `step(inputs,
targets)` that runs forward and backward of this rank's share of one global batch.

    model = build_model(cfg, seed, device="meta")       # parameters on the meta device: no storage
    run = apply_plan(model, plan,                       # collective: every rank of the world calls it
                     materialize=lambda m: materialize(m, seed))   # fill only what this rank keeps
    opt = torch.optim.AdamW(run.parameters(), lr=3e-4)
    for inputs, targets in batches:                     # the whole global batch (rows = plan.global_batch)
        loss = run.step(inputs, targets)                # global mean loss, the same on every rank
        opt.step(); opt.zero_grad()

Loss convention (torchtitan's, training_contract.md): each micro-batch's loss is its summed
cross-entropy divided by the GLOBAL count of target tokens (computed from the global batch every rank
is given), MoE aux losses are added the same way, and gradients are SUM-reduced over DP replicas with
no averaging anywhere; so one step on any plan equals one step of the single-process model on the same
global batch with a mean loss (tests/test_strategies_composed.py holds this).

Meta-device construction (issue 23): per stage, StageModule keeps the stage's layers of the (meta)
model, TP and EP keep this rank's shards and experts, then the `materialize` hook allocates and fills
what is left (before DDP, which broadcasts real tensors; after FSDP2, so only this rank's shard is ever
allocated). A model already on a real device passes through unchanged.

Precision (hal.strategies.precision): each stage's forward runs under the rank's autocast and hands
float32 activations on; FSDP2 stages take the DP group's MixedPrecisionPolicy (float32 reduction); a
loss scale (`set_loss_scale`) multiplies the loss and the MoE aux gradient.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

from hal.strategies.models.data import IGNORE_INDEX, count_tokens, lm_loss_sum
from hal.strategies.mesh import HeteroMesh, MeshError
from hal.strategies.pipeline_parallel import (HETERO_SCHEDULES, HeteroPipeline, PipelineError, TorchPipeline,
                                         check_torch_layout)


class _AttachAux(torch.autograd.Function):
    """Identity on the activations that also sends gradient 1 into `aux` (a stage's MoE aux loss), so
    a stage that is not last still back-propagates its aux loss (Megatron's MoEAuxLossAutoScaler)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
        ctx.aux_shape = aux.shape
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, torch.ones(ctx.aux_shape, dtype=torch.float32, device=grad.device)


def _to_wire(x: torch.Tensor) -> torch.Tensor:
    """A stage boundary carries plain, full tensors (the same on every TP rank of a replica)."""
    from torch.distributed.tensor import DTensor
    return x.full_tensor() if isinstance(x, DTensor) else x


_SAVED_GEMMS = {"mm", "addmm", "bmm", "baddbmm", "linear", "matmul", "_scaled_mm"}


def _attention_only(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    """Selective recompute's policy (torch.utils.checkpoint): keep the GEMMs' outputs, recompute the
    rest in backward: the attention core (Korthikanti et al. 2022) and the cheap memory-bound ops
    around it. (Saving those too, as Megatron-LM does, breaks on ops that change a saved output in
    place, RMSNorm's `.add_(eps)`; recomputing them costs memory bandwidth, not GEMM FLOPs.)"""
    from torch.utils.checkpoint import CheckpointPolicy
    name = getattr(getattr(op, "overloadpacket", op), "__name__", str(op))
    return CheckpointPolicy.MUST_SAVE if name in _SAVED_GEMMS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_context() -> Any:
    from torch.utils.checkpoint import create_selective_checkpoint_contexts
    return create_selective_checkpoint_contexts(_attention_only)


class StageModule(nn.Module):
    """One pipeline stage of a GPT (hal.strategies.models): the embedding (first stage), blocks [start, end), the
    final norm and head (last stage). Attribute names follow the model's (`embed`, `blocks.<i>` with
    the global block index, `norm`, `head`), so `named_parameters()` gives the full model's names."""

    def __init__(self, model: nn.Module, layers: tuple[int, int], first: bool, last: bool,
                 recompute: str = "none", aux_coef: float = 0.0, aux_scale: float = 1.0,
                 precision: Any = None, device_type: str = "cpu") -> None:
        super().__init__()
        self.precision, self.device_type = precision, device_type
        self.grad_scale = 1.0  # the loss scale: the aux loss's gradient carries it too
        self.wire_dtype = next(model.parameters()).dtype  # activations leave a stage in the model's dtype
        self.cfg = getattr(model, "cfg", None)  # sizes, for the strategies' own checks (TP's seq % tp)
        self.embed = model.embed if first else None
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in range(*layers)})
        self.norm = getattr(model, "norm", None) if last else None
        self.head = model.head if last else None
        self.recompute = recompute        # "none" | "selective" | "full"
        self.aux_coef, self.aux_scale = aux_coef, aux_scale
        # GPT's blocks take the rotary tables (shared buffers, not parameters)
        self.register_buffer("rope_cos", model.rope_cos, persistent=False)
        self.register_buffer("rope_sin", model.rope_sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.precision is None:
            return self._forward(x)
        with self.precision.autocast(self.device_type):
            return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        rope = (self.rope_cos, self.rope_sin)
        for block in self.blocks.values():
            # full recompute: keep only the block input, re-run the block in backward; selective:
            # re-run only the attention core (Korthikanti et al. 2022), keep every other op's output
            if self.recompute == "full":
                x = checkpoint(block, x, *rope, use_reentrant=False)
            elif self.recompute == "selective":
                x = checkpoint(block, x, *rope, use_reentrant=False, context_fn=_selective_context)
            else:
                x = block(x, *rope)
        if self.norm is not None:
            x = self.norm(x)
        if self.head is not None:
            x = self.head(x)
        x = _to_wire(x)
        if x.is_floating_point() and x.dtype != self.wire_dtype:
            x = x.to(self.wire_dtype)  # 16-bit compute, float32 between stages (and into the loss)
        aux = self.aux_loss()
        return x if aux is None else _AttachAux.apply(x, aux)

    def aux_loss(self) -> Optional[torch.Tensor]:
        """coef x sum of this stage's MoE layers' aux-loss shares (GPT.aux_loss over this stage's blocks)
        x aux_scale (1/num_microbatches, as hal.strategies.data_parallel.accumulate scales it)."""
        if not self.aux_coef:
            return None
        from hal.strategies.moe import MoE
        shares = [m.aux_loss for m in self.modules() if isinstance(m, MoE) and m.aux_loss is not None]
        if not shares:
            return None
        return self.aux_coef * self.aux_scale * self.grad_scale * torch.stack([s.float() for s in shares]).sum()


class TokenLoss:
    """loss_fn(logits (rows, seq, vocab), targets (rows, seq)) = summed cross entropy / global tokens;
    `denominator` is set for every step from the global batch."""

    def __init__(self, ignore_index: int = IGNORE_INDEX) -> None:
        self.ignore_index = ignore_index
        self.denominator = 1.0
        self.scale = 1.0  # dynamic loss scale (float16 ranks); AppliedPlan.step divides it back out

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = lm_loss_sum(logits, targets, self.ignore_index) / self.denominator
        return loss if self.scale == 1.0 else loss * self.scale


class AppliedPlan:
    """What `apply_plan` returns on one rank (see the module docstring)."""

    def __init__(self, mesh: HeteroMesh, modules: dict[int, nn.Module], runtime: Any, loss: TokenLoss,
                 plan: Any, grad_sync: Callable[[], None]) -> None:
        self.mesh, self.modules, self.runtime, self.loss, self.plan = mesh, modules, runtime, loss, plan
        self._grad_sync = grad_sync

    @property
    def active(self) -> bool:
        return bool(self.modules)

    def set_loss_scale(self, scale: float) -> None:
        """Multiply every following step's loss (and MoE aux gradient) by `scale`; `step` still returns
        the unscaled loss; the caller unscales the gradients (hal.strategies.precision.LossScaler)."""
        self.loss.scale = float(scale)
        for m in self.modules.values():
            inner = getattr(m, "module", m)
            if isinstance(inner, StageModule):
                inner.grad_scale = float(scale)

    def parameters(self) -> list[nn.Parameter]:
        """This rank's parameters (local shards under FSDP/TP), each once: give these to the optimizer."""
        seen, out = set(), []
        for m in self.modules.values():
            for p in m.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def _rows(self, t: torch.Tensor, stage: int) -> list[torch.Tensor]:
        """This rank's rows of each micro-batch of a global-batch tensor (global_batch, ...)."""
        mb, M = self.mesh.microbatch_size, self.plan.num_microbatches
        lo, hi = self.mesh.role(stage).rows
        return [t[m * mb + lo:m * mb + hi] for m in range(M)]  # M x (rows, ...)

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Forward and backward of this rank's share of the global batch (inputs, targets: (global_batch,
        seq)); gradients are reduced over DP when it returns. Returns the global mean cross-entropy of
        the step (MoE aux losses are in the gradients, not in this figure) on every rank: one
        all_reduce of a scalar over the world."""
        mb, M = self.mesh.microbatch_size, self.plan.num_microbatches
        if inputs.shape[0] != mb * M or targets.shape[0] != mb * M:  # on every rank, before any collective
            raise PipelineError(f"rank {self.mesh.rank}: global batch has {inputs.shape[0]} rows (targets "
                                f"{targets.shape[0]}), plan expects {M} micro-batches x {mb} rows = {mb * M}")
        self.loss.denominator = float(count_tokens(targets, self.loss.ignore_index))
        share = torch.zeros((), dtype=torch.float32)
        if self.active:
            first = min(self.modules)
            last = max(self.modules)
            ins = self._rows(inputs, first) if first == 0 else [None] * self.plan.num_microbatches
            tgs = self._rows(targets, last) if last == self.mesh.num_stages - 1 else [None] * len(ins)
            share = self.runtime.step(ins, tgs) / self.loss.scale
            self._grad_sync()
            if self.mesh.role(last).tp_index != 0 or last != self.mesh.num_stages - 1:
                share = torch.zeros((), dtype=torch.float32)  # count each replica's loss once
        share = share.reshape(1).clone()
        dist.all_reduce(share, group=self.mesh.world)
        return share[0]

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter this rank's stage(s) hold, gathered to full tensors under FSDP/TP, by the full
        model's names (a collective over each stage's groups: call on every rank)."""
        from torch.distributed.tensor import DTensor
        out = {}
        for m in self.modules.values():
            inner = getattr(m, "module", m)
            for name, p in inner.named_parameters():
                full = p.full_tensor() if isinstance(p, DTensor) else p
                out[name] = full.detach().clone()
        return out


def _sum_grads(modules: dict[int, nn.Module], mesh: HeteroMesh, skip: set[int]) -> None:
    """SUM all_reduce of every replicated parameter's gradient over its stage's DP group (one flat
    buffer per stage), for zero=0 when the stage is not wrapped in DDP (TP-sharded stages: torch DDP
    does not take DTensor parameters). Expert parameters (`skip`) are not reduced: EP already summed
    them (hal/strategies/expert_parallel.py)."""
    from torch.distributed.tensor import DTensor
    for s, m in modules.items():
        group = mesh.dp_group(s)
        if dist.get_world_size(group) == 1:
            continue
        grads = []
        for p in m.parameters():
            if id(p) in skip:
                continue
            if p.grad is None:  # keep every rank's flat layout the same: a missing gradient is zero
                p.grad = torch.zeros_like(p)
            grads.append(p.grad._local_tensor if isinstance(p.grad, DTensor) else p.grad)
        if not grads:
            continue
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=group)
        off = 0
        for g in grads:
            g.copy_(flat[off:off + g.numel()].view_as(g))
            off += g.numel()


def apply_plan(model: nn.Module, plan: Any, topology: Any = None, *, runtime: str = "auto",
               timeout: Optional[timedelta] = None, device: Optional[torch.device] = None,
               model_cfg: Any = None, materialize: Optional[Callable[[nn.Module], Any]] = None,
               precision: Any = None) -> AppliedPlan:
    """Lay `model` out as `plan` says on this rank (collective over the world: every rank calls it,
    also ranks the plan leaves idle). `topology` (hal.core.topology.Topology) and `model_cfg` are used to
    run `plan.check` when given. `runtime`: "hetero" (HeteroPipeline, any layout, 1F1B/GPipe),
    "torch" (torch.distributed.pipelining schedules; needs equal chains), "auto" (torch for the
    interleaved and zero-bubble schedules, hetero otherwise). `materialize(stage_module)`: fills the
    meta parameters this rank keeps (hal.strategies.models.init.materialize, or a checkpoint loader);
    needed when `model` is on the meta device. `precision`: a hal.strategies.precision.Precision."""
    if runtime not in ("auto", "hetero", "torch"):
        raise PipelineError(f"apply_plan: runtime={runtime!r}; expected auto, hetero or torch")
    if topology is not None and model_cfg is not None:
        plan.check(topology, model_cfg)
    use_torch = runtime == "torch" or (runtime == "auto" and plan.schedule not in HETERO_SCHEDULES)
    mesh = HeteroMesh(plan, timeout=timeout)
    S, M = mesh.num_stages, plan.num_microbatches
    cfg = model_cfg or getattr(model, "cfg", None)
    aux_coef = float(getattr(cfg, "moe_aux_loss_coef", 0.0) or 0.0) if getattr(cfg, "experts", 0) else 0.0
    # layout verdicts every rank reaches alike, before any stage is built (no rank left in a collective)
    if use_torch:
        check_torch_layout(mesh, plan.schedule)
        mesh.chain_group(timeout)  # every rank creates the chain groups, idle ranks included
    else:
        if plan.schedule not in HETERO_SCHEDULES:
            raise PipelineError(f"apply_plan: schedule {plan.schedule!r} needs runtime 'torch' (or 'auto')")
        multi = sorted({r for g in mesh.grids for r in g.all_ranks
                        if sum(r in h.all_ranks for h in mesh.grids) > 1})
        if multi:
            raise PipelineError(f"ranks {multi} host several stages; the hetero runtime runs one stage per "
                                f"rank (use an interleaved schedule on torch's runtime)")
    modules: dict[int, nn.Module] = {}
    expert_ids: set[int] = set()
    for role in mesh.roles:
        s = role.stage
        st = plan.stages[s]
        mod = StageModule(model, tuple(st.layers), s == 0, s == S - 1, st.recompute, aux_coef, 1.0 / M,
                          precision, mesh.device_type)
        grid = mesh.grids[s]
        if grid.tp > 1:
            _apply_tp(mod, mesh, s, plan.zero, topology)
        if grid.experts is not None:
            expert_ids |= _apply_ep(mod, mesh, s)
        if plan.zero == 0:  # DDP broadcasts real tensors: materialise first
            _materialize(mod, materialize, mesh.rank, s)
        modules[s] = _apply_dp(mod, plan.zero, mesh, s, grid.experts is not None, ddp=not use_torch,
                               precision=precision)
        if plan.zero:  # FSDP2 sharded the meta parameters: allocate only this rank's shards
            _materialize(modules[s], materialize, mesh.rank, s)
    loss = TokenLoss()
    feature = (cfg.seq, getattr(cfg, "hidden", None) or cfg.dim) if cfg is not None else None
    if not modules:
        rt = None
    elif use_torch:
        rt = TorchPipeline(modules, mesh, loss, M, plan.schedule, device, timeout,
                           examples=lambda s: _examples(mesh, s, cfg, device))
    else:
        (mod,) = modules.values()
        dtype = next(model.parameters()).dtype  # activations between stages travel in the model's dtype
        rt = HeteroPipeline(mod, mesh, loss, M, feature, dtype=dtype, schedule=plan.schedule, device=device)

    def grad_sync() -> None:
        if plan.zero == 0:
            _sum_grads({s: m for s, m in modules.items() if not _is_wrapped(m)}, mesh, expert_ids)
        # expert data parallel (ep < dp): the copies of each expert SUM their gradients (every zero
        # level: DDP and FSDP2 both leave expert parameters out)
        from hal.strategies.expert_parallel import reduce_expert_grads
        for s, m in modules.items():
            if mesh.grids[s].experts is not None:
                reduce_expert_grads(getattr(m, "module", m), mesh.expert_dp_group(s))
    return AppliedPlan(mesh, modules, rt, loss, plan, grad_sync)


def _materialize(mod: nn.Module, hook: Optional[Callable[[nn.Module], Any]], rank: int, s: int) -> None:
    """Run the `materialize` hook on a stage whose parameters (some) are on the meta device; refuse a
    stage left with meta parameters (no hook, or a hook that missed some)."""
    from hal.strategies.models.init import meta_names
    if not meta_names(mod):
        return
    if hook is not None:
        hook(mod)
    left = meta_names(mod)
    if left:
        raise PipelineError(f"rank {rank} stage {s}: parameters {left[:4]}{' ...' if len(left) > 4 else ''} "
                            f"are on the meta device after apply_plan's materialize step "
                            f"({'no materialize hook given' if hook is None else 'the hook left them'})")


def _examples(mesh: HeteroMesh, s: int, cfg: Any, device) -> tuple[torch.Tensor, torch.Tensor]:
    """One micro-batch's input and output of stage s on this rank: ids (rows, seq) int64 into stage 0,
    activations (rows, seq, hidden) between stages, logits (rows, seq, vocab) out of the last."""
    lo, hi = mesh.role(s).rows
    hidden = getattr(cfg, "hidden", None) or cfg.dim
    def act():  # requires_grad: torch sends a gradient back only for inputs that require one
        return torch.empty(hi - lo, cfg.seq, hidden, device=device, requires_grad=True)
    ins = torch.zeros(hi - lo, cfg.seq, dtype=torch.int64, device=device) if s == 0 else act()
    outs = torch.empty(hi - lo, cfg.seq, cfg.vocab, device=device) if s == mesh.num_stages - 1 else act()
    return ins, outs


def _is_wrapped(m: nn.Module) -> bool:
    from hal.contract.compat import fsdp
    FSDPModule = fsdp().FSDPModule
    from torch.nn.parallel import DistributedDataParallel
    return isinstance(m, (DistributedDataParallel, FSDPModule))


def _apply_tp(mod: StageModule, mesh: HeteroMesh, s: int, zero: int, topology: Any = None) -> None:
    """H4's tensor parallel (hal.strategies.tensor_parallel.apply_tp) on the stage's blocks over its TP
    group. With FSDP2 on top (zero 2/3) it shards on the "tp" dimension of the stage's 2-D ("dp", "tp")
    mesh: torch 2.13's fully_shard concatenates the DP and TP meshes and needs both cut from one parent
    (fsdp/_fully_shard/_fsdp_param.py, DeviceMesh._concatenate)."""
    from hal.strategies.tensor_parallel import apply_tp
    sub = mesh.device_mesh(s)["tp"] if zero else None
    apply_tp(mod, mesh.tp_group(s), topology=topology, device_type=mesh.device_type, mesh=sub)


def _apply_ep(mod: StageModule, mesh: HeteroMesh, s: int) -> set[int]:
    """EP over this rank's EP group at its TP index (H4's apply_ep) with the plan's placement (expert
    ids per replica = per EP rank, as replicas ascend by rank): the stage's DP group, or with the
    stage's `ep` < dp its block of ep replicas, routing statistics over the DP group (expert data
    parallel; grad_sync then reduces expert gradients over the expert-DP group). Returns the ids of
    the expert parameters kept here."""
    from hal.strategies.expert_parallel import apply_ep
    grid = mesh.grids[s]
    role = mesh.role(s)
    ranks = grid.dp_ranks(role.tp_index)
    if ranks != sorted(ranks):
        # the MoE layer orders tokens (hence which ones a full expert drops) by EP rank, which must be
        # the replicas' row order for the result to equal the single-process one
        raise MeshError(f"stages[{s}]: EP ranks {ranks} (replica order) do not ascend; order the replicas "
                        f"of an expert stage by rank so EP rank order is row order")
    e = grid.ep_degree
    k = role.replica // e
    stats = mesh.dp_group(s) if e < grid.dp else None
    names = set(apply_ep(mod, mesh.ep_group(s), grid.experts[k * e:(k + 1) * e], stats_group=stats))
    return {id(p) for n, p in mod.named_parameters() if n in names}


def _apply_dp(mod: StageModule, zero: int, mesh: HeteroMesh, s: int, has_experts: bool,
              ddp: bool = True, precision: Any = None) -> nn.Module:
    """H2's data parallel for one stage over its DP group, gradients SUMMED (no averaging):
    zero 0 -> DDP (wrap_ddp, sum_gradients) where DDP can take the parameters (not TP DTensors; a
    TP stage, or a 1-replica stage, stays plain and `_sum_grads` reduces it after the step);
    zero 2/3 -> FSDP2 (shard_fsdp2; each block one unit). Expert parameters are left out of both.
    `ddp=False` (torch's schedules): torch 2.13's zero-bubble schedules compute weight gradients with
    autograd.grad (pipelining/_backward.py, stage_backward_weight), which DDP's reducer hooks do not
    see, so replicas diverged; there the stage stays plain and `_sum_grads` reduces after the step.
    `precision`: FSDP2 takes its MixedPrecisionPolicy for the stage's DP ranks (float32 reduce-scatter)."""
    from hal.strategies.data_parallel import wrap_ddp
    from hal.strategies.sharded_data_parallel import disable_gradient_division, shard_fsdp2
    grid = mesh.grids[s]
    group = mesh.dp_group(s)
    if zero == 0:
        if grid.tp > 1 or grid.dp == 1 or not ddp:
            return mod
        if has_experts:
            from hal.strategies.expert_parallel import ddp_ignore_experts
            ddp_ignore_experts(mod)
        return wrap_ddp(mod, group, bucket_cap_mb=1.0, sum_gradients=True)
    if grid.tp > 1:
        dmesh = mesh.device_mesh(s)["dp"]
    else:
        from torch.distributed.device_mesh import DeviceMesh
        dmesh = DeviceMesh.from_group(group, mesh.device_type)
    mp = {} if precision is None else {"mp_policy": precision.fsdp_policy(grid.all_ranks)}
    if not has_experts:
        return shard_fsdp2(mod, mod.blocks.values(), dmesh, zero=zero, sum_gradients=True, **mp)
    from hal.contract.compat import fully_shard

    from hal.strategies.expert_parallel import expert_params
    for block in mod.blocks.values():
        fully_shard(block, mesh=dmesh, reshard_after_forward=zero == 3, ignored_params=expert_params(block), **mp)
    fully_shard(mod, mesh=dmesh, ignored_params=expert_params(mod), **mp)
    disable_gradient_division(mod)
    return mod
