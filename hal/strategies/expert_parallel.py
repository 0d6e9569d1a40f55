"""Expert parallelism: the MoE layers of a model keep only this rank's experts and move tokens over an
EP process group (any group, `hetero` spanning chip kinds included); how that composes with DP.

    from hal.strategies.expert_parallel import apply_ep, expert_parameter_names, ddp_ignore_experts
    apply_ep(model, ep_group, placement=[[0, 1, 2, 3], [4, 5], [6], [7]])  # a fast chip hosts more
    ddp_ignore_experts(model)               # before DistributedDataParallel(model, process_group=dp)
    fully_shard(block, mesh=dp_mesh, ignored_params=expert_params(block))   # FSDP2 instead of DDP

Composition with DP (training_contract.md): the EP group of (stage s, tp index t) IS the DP group of
(s, t): [replica.ranks[t] for replica in stage.replicas]. So every DP rank is also an EP rank; it feeds
its own micro-batch rows to the MoE layer, the all_to_all carries each token to the rank hosting its
expert, and back. Gradients then split in two kinds:
- expert parameters live exactly once in the EP group: the reverse all_to_all in backward already
  brought every rank's token gradients to the expert's host, so the host's gradient is the gradient
  of the SUM of all ranks' losses. It must NOT be reduced again (DDP/FSDP must ignore these params);
  with the contract's loss convention (each rank's loss divided by the global token count) that sum
  is exactly the single-process gradient on the global batch.
- every other parameter (attention, norms, router, embedding, head) is replicated across the DP group
  and SUM-reduced there as usual (the DP wrapper's own averaging switched off, per the contract).
The EP group may be the DP group object itself or a second group over the same ranks. Both work
here: with one group the DDP bucket all_reduces and the MoE all_to_alls share one sequence of
collectives, which must then be issued in the same order on every rank. Observed: the parity cases
pass with one group on 2+2, 3+1, 2+1+1 and 3+2+1 (DDP); our reading is that autograd runs ready nodes
in reverse creation order, which places the all_to_all backward nodes alike on every rank even when
ranks host different numbers of experts. A separate group removes that dependence on autograd's
scheduling, and is what the tests use.
Expert data parallel (a Plan stage's `ep` < dp; Megatron-LM / DeepSpeed's expert-DP): the DP group
is cut into EP groups of ep consecutive ranks, each hosting every expert once with the same
placement, so every expert has dp / ep copies. `apply_ep(..., stats_group=dp_group)` keeps the
routing statistics global (hal/strategies/moe.py: the same tokens drop as in one process); tokens move
only inside their EP group, so a copy's gradient covers its EP group's tokens only, and
`reduce_expert_grads(model, expert_dp_group)` SUM-reduces the copies over the expert-DP group (EP
index i of every EP group) after backward; the sum is the single-process gradient.
With TP > 1 each TP index has its own EP group; the MoE layer is not TP-sharded (the MoE input is the
full, TP-replicated activation), so the TP ranks of a replica run the same expert work on the same
tokens and hold identical expert gradients: nothing to reduce across TP either.
The capacity semantics (global order, so EP/DP splits never change which tokens drop) and the aux
loss share are defined in hal/strategies/moe.py.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch.distributed as dist
from torch import nn

from .moe import MoE, MoEError, check_placement, even_placement


def moe_layers(model: nn.Module) -> list[tuple[str, MoE]]:
    """(qualified name, layer) of every MoE layer in `model`, in module order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, MoE)]


def weighted_placement(experts: int, speeds: Sequence[float]) -> list[list[int]]:
    """Expert ids per EP rank in proportion to `speeds` (largest remainders; every rank with speed > 0
    may still get 0 experts when experts < ranks). A faster chip hosts more experts."""
    if not speeds or any(s < 0 for s in speeds) or sum(speeds) <= 0:
        raise MoEError(f"weighted_placement: speeds {list(speeds)} must be >= 0 with a positive sum")
    total = float(sum(speeds))
    quota = [experts * s / total for s in speeds]
    n = [int(q) for q in quota]
    for r in sorted(range(len(speeds)), key=lambda r: quota[r] - n[r], reverse=True)[:experts - sum(n)]:
        n[r] += 1
    out, start = [], 0
    for c in n:
        out.append(list(range(start, start + c)))
        start += c
    return out


def apply_ep(model: nn.Module, ep_group: Optional[dist.ProcessGroup],
             placement: Optional[Sequence[Sequence[int]]] = None,
             stats_group: Optional[dist.ProcessGroup] = None) -> list[str]:
    """Make every MoE layer of `model` expert-parallel over `ep_group` with `placement` (expert ids per
    EP rank, the same for every layer; default even_placement). Experts this rank does not host are
    deleted, so build the full model (same seed on every rank), then call this. Returns the names of
    the expert parameters kept here. Raises MoEError naming the layer when a placement does not fit.
    `stats_group`: under expert data parallel, the DP group `ep_group` is a block of (see the module
    docstring); then also call `reduce_expert_grads` after every backward.
    """
    layers = moe_layers(model)
    if not layers:
        raise MoEError(f"apply_ep: {type(model).__name__} has no hal.strategies.moe.MoE layer")
    size = 1 if ep_group is None else dist.get_world_size(ep_group)
    for name, layer in layers:
        p = even_placement(layer.num_experts, size) if placement is None else placement
        try:
            check_placement(p, layer.num_experts, size)
        except MoEError as exc:
            raise MoEError(f"apply_ep, layer {name!r}: {exc}") from None
        layer.set_group(ep_group, p, stats_group)
    return expert_parameter_names(model)


def reduce_expert_grads(model: nn.Module, expert_dp_group: Optional[dist.ProcessGroup]) -> int:
    """SUM all_reduce of the expert parameters' gradients over the expert-DP group (the ranks holding
    the same experts, one per EP group), in one flat buffer; a missing gradient counts as zero so
    every member's layout matches. Returns the number of elements reduced (0 for a 1-rank group).
    Bounded by the group's own timeout, as every torch.distributed call."""
    if expert_dp_group is None or dist.get_world_size(expert_dp_group) == 1:
        return 0
    import torch
    # module order: members of an expert-DP group host the same experts, so the same layout
    params = [p for _, layer in moe_layers(model) for p in layer.experts.parameters() if p.requires_grad]
    if not params:
        return 0
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat, group=expert_dp_group)
    off = 0
    for p in params:
        p.grad.copy_(flat[off:off + p.numel()].view_as(p.grad))
        off += p.numel()
    return flat.numel()


def expert_parameter_names(model: nn.Module) -> list[str]:
    """Qualified names of the expert parameters (`...experts.<id>.w1.weight`, ...) of `model`."""
    out = []
    for name, layer in moe_layers(model):
        prefix = f"{name}." if name else ""
        out += [f"{prefix}experts.{n}" for n, _ in layer.experts.named_parameters()]
    return out


def expert_params(model: nn.Module) -> set[nn.Parameter]:
    """The expert parameter objects (for FSDP2's `fully_shard(..., ignored_params=...)`)."""
    return {p for _, layer in moe_layers(model) for p in layer.experts.parameters()}


def ddp_ignore_experts(model: nn.Module) -> list[str]:
    """Tell torch DDP (before wrapping) not to all-reduce or broadcast expert parameters: each expert
    lives once in the EP group and its gradient is already complete (see the module docstring)."""
    from torch.nn.parallel import DistributedDataParallel
    names = expert_parameter_names(model)
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)
    return names


def aux_loss(model: nn.Module):
    """Sum of the MoE layers' aux-loss shares from the last forward (None when no layer ran)."""
    shares = [layer.aux_loss for _, layer in moe_layers(model) if layer.aux_loss is not None]
    return sum(shares) if shares else None


def inject_aux_loss(model: nn.Module, coef: Optional[float]) -> None:
    """Let every MoE layer put coef x its aux-loss share into backward itself (no aux term in the
    loss): what a pipeline stage needs, since only the last stage computes a loss. None switches it
    off (the model's loss then adds coef x aux_loss(), e.g. GPT.aux_loss())."""
    for _, layer in moe_layers(model):
        layer.inject_aux_coef = coef
