"""Functions the expert-parallel parity tests run on every rank of a WorkerPool (module level).

Each case trains a tiny MoE language model (embedding, then MoE FFN blocks with pre-RMSNorm, then a
head; every op through hal.ops) for STEPS SGD steps with its MoE layers expert-parallel over an EP
group (a `hetero` subgroup spanning chip kinds), with an uneven expert placement and an uneven number
of rows per rank, and the non-expert parameters reduced by torch DDP over the same group (EP group =
DP group, training_contract.md) with expert parameters ignored by DDP. Every rank then compares what
it holds with a single-process run of the full model on the same global batch, computed right here.

Loss convention (training_contract.md): rank loss = CE summed over its tokens / GLOBAL token count +
coef * its aux-loss share; DDP's averaging is replaced by a SUM comm hook (hal.strategies.data_parallel
wrap_ddp(sum_gradients=True)), FSDP2's by hal.strategies.sharded_data_parallel.disable_gradient_division,
so the summed gradient is the gradient of the single-process loss mean-CE + coef * aux. SGD, not Adam: Adam is invariant to the
gradient's scale and would hide a doubled or halved reduction.
"""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

import hal.ops as ops

VOCAB, HIDDEN, FFN, EXPERTS, TOP_K, LAYERS, SEQ = 32, 16, 24, 8, 2, 2, 8
MODEL_SEED, DATA_SEED = 0, 1
STEPS, LR, AUX_COEF = 3, 0.5, 0.1

_groups: dict = {}


def init(backend: str = "hetero", timeout_s: float = 120.0) -> dict:
    """Join the default group once per worker; report this rank's chip."""
    import hal
    import hal.ccl_bridge  # noqa: F401 - registers the backend
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    acc = hal.accelerator()
    return {"rank": dist.get_rank(), "chip": acc.chip.name, "emulated": acc.emulated,
            "backend": dist.get_backend()}


def subgroup(ranks: tuple, role: str = "ep") -> dist.ProcessGroup:
    """A hetero new_group of `ranks` for `role` (every world rank calls it; cached). EP and DP get
    separate group objects over the same ranks (see hal/strategies/expert_parallel.py)."""
    key = (tuple(ranks), role)
    if key not in _groups:
        _groups[key] = dist.new_group(list(ranks), backend="hetero", timeout=timedelta(seconds=120))
    return _groups[key]


class MoEBlock(nn.Module):
    def __init__(self, capacity_factor) -> None:
        super().__init__()
        from hal.strategies.moe import MoE
        self.ffn_norm = nn.Parameter(torch.ones(HIDDEN))
        self.moe = MoE(HIDDEN, FFN, EXPERTS, TOP_K, capacity_factor)

    def forward(self, x):
        return x + self.moe(ops.rms_norm(x, self.ffn_norm))


class TinyMoELM(nn.Module):
    def __init__(self, capacity_factor) -> None:
        super().__init__()
        self.embed = nn.Parameter(torch.empty(VOCAB, HIDDEN))
        self.blocks = nn.ModuleList(MoEBlock(capacity_factor) for _ in range(LAYERS))
        self.norm = nn.Parameter(torch.ones(HIDDEN))
        self.head = nn.Parameter(torch.empty(VOCAB, HIDDEN))

    def forward(self, ids):
        x = ops.embedding(ids, self.embed)
        for b in self.blocks:
            x = b(x)
        return ops.linear(ops.rms_norm(x, self.norm), self.head)


def build(capacity_factor) -> TinyMoELM:
    """Same weights in every process: N(0, 0.3) drawn in parameter-name order (norm gains 1)."""
    model = TinyMoELM(capacity_factor)
    g = torch.Generator().manual_seed(MODEL_SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model


def batches(global_batch: int) -> torch.Tensor:
    """(STEPS, global_batch, SEQ + 1) token ids with learnable structure."""
    g = torch.Generator().manual_seed(DATA_SEED)
    start = torch.randint(0, VOCAB, (STEPS, global_batch, 1), generator=g)
    walk = (start + 3 * torch.arange(SEQ + 1)) % VOCAB
    noise = torch.randint(0, VOCAB, walk.shape, generator=g)
    return torch.where(torch.rand(walk.shape, generator=g) < 0.2, noise, walk)


def step_loss(model, rows: torch.Tensor, global_tokens: int) -> torch.Tensor:
    """This rank's share of the global loss: sum-CE / global tokens + coef * aux share."""
    from hal.strategies.expert_parallel import aux_loss
    logits = model(rows[:, :-1])
    ce = ops.cross_entropy(logits.reshape(-1, VOCAB), rows[:, 1:].reshape(-1), reduction="sum")
    return ce / global_tokens + AUX_COEF * aux_loss(model)


def reference(capacity_factor, global_batch: int):
    """Single process, full model, whole global batch: (final params, initial params, losses, drops)."""
    from hal.strategies.expert_parallel import moe_layers
    model = build(capacity_factor)
    init_state = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    data, losses, drops = batches(global_batch), [], []
    for s in range(STEPS):
        loss = step_loss(model, data[s], global_batch * SEQ)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        drops.append([m.last_stats["dropped_global"] for _, m in moe_layers(model)])
    return {n: p.detach().clone() for n, p in model.named_parameters()}, init_state, losses, drops


def _fsdp2_but_experts(model, dp_group):
    """FSDP2 (ZeRO-3) over the DP group on every block and the root, expert parameters ignored
    (each lives once in the EP group), gradients SUMMED."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    from hal.strategies.expert_parallel import expert_params
    from hal.strategies.sharded_data_parallel import disable_gradient_division
    mesh = DeviceMesh.from_group(dp_group, "cpu")
    for block in model.blocks:
        fully_shard(block, mesh=mesh, ignored_params=expert_params(block))
    fully_shard(model, mesh=mesh, ignored_params=expert_params(model))
    disable_gradient_division(model)
    return model


def train_ep(ranks: tuple, placement: list, rows: list, capacity_factor, dp: str = "ddp") -> dict:
    """EP (and DP of the dense params: torch DDP, or FSDP2 with dp="fsdp2") over hetero subgroup
    `ranks`; this rank feeds `rows[ep_rank]` rows."""
    from hal.strategies.data_parallel import wrap_ddp
    from hal.strategies.expert_parallel import apply_ep, ddp_ignore_experts, moe_layers
    group, dp_group = subgroup(ranks, "ep"), subgroup(ranks, "dp")
    if dist.get_rank() not in ranks:
        return {"member": False}
    me = dist.get_rank(group)
    model = build(capacity_factor)
    kept = apply_ep(model, group, placement)
    if dp == "ddp":
        ignored = ddp_ignore_experts(model)
        ddp = wrap_ddp(model, dp_group, bucket_cap_mb=0.01, sum_gradients=True)  # H2's DDP, SUM hook
    else:
        ddp, ignored = _fsdp2_but_experts(model, dp_group), sorted(kept)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    gb = sum(rows)
    data = batches(gb)
    lo, hi = sum(rows[:me]), sum(rows[:me + 1])
    losses, drops, traffic = [], [], []
    for s in range(STEPS):
        loss = step_loss(ddp, data[s, lo:hi], gb * SEQ)
        loss.backward()
        opt.step()
        opt.zero_grad()
        total = loss.detach().clone().reshape(1)
        dist.all_reduce(total, group=group)
        losses.append(total.item())
        drops.append([m.last_stats["dropped_global"] for _, m in moe_layers(model)])
        traffic.append([(m.last_stats["sent"], m.last_stats["received"]) for _, m in moe_layers(model)])
    ref, init_state, ref_losses, ref_drops = reference(capacity_factor, gb)
    held = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach() for n, p in model.named_parameters()}
    hosted = sorted({int(n.split("experts.")[1].split(".")[0]) for n in held if "experts." in n})
    return {"member": True, "ep_rank": me, "names": sorted(held), "expert_names": sorted(kept),
            "ddp_ignored": sorted(ignored), "hosted": hosted,
            "param_diffs": {n: (held[n] - ref[n]).abs().max().item() for n in held},
            "moved": {n: (ref[n] - init_state[n]).abs().max().item() for n in held},
            "losses": losses, "ref_losses": ref_losses, "drops": drops, "ref_drops": ref_drops,
            "traffic": traffic}


def train_ep_dp_tp(replicas: list, placement: list, rows: list, sequence_parallel: bool = True) -> dict:
    """EP inside DP with TP on hal.strategies.models.GPT (MoE): `replicas` are TP groups (one chip kind
    each); the EP group and the DP group of tp index t are [replica[t] for replica in replicas]
    (training_contract.md), separate group objects; replica i feeds rows[i] rows of the global batch.
    Non-expert gradients (local shards of the TP DTensors) are SUM all-reduced over the DP group;
    expert gradients are left alone."""
    from hal.strategies.expert_parallel import apply_ep, expert_parameter_names, moe_layers
    from hal.strategies.models import build_model, lm_loss_sum, make_batches
    from hal.strategies.tensor_parallel import apply_tp, tp_full_state

    from . import _strategy_tp_cases as tpc
    MOE = tpc.MOE
    if sum(rows) != tpc.GLOBAL_BATCH:
        raise ValueError(f"rows {rows} must sum to the reference's global batch {tpc.GLOBAL_BATCH}")
    tp = len(replicas[0])
    for r in replicas:
        subgroup(tuple(r), "tp")
    ep_groups = [subgroup(tuple(r[t] for r in replicas), "ep") for t in range(tp)]
    dp_groups = [subgroup(tuple(r[t] for r in replicas), "dp") for t in range(tp)]
    me = dist.get_rank()
    where = [(i, r.index(me)) for i, r in enumerate(replicas) if me in r]
    if not where:
        return {"member": False}
    rep, t = where[0]
    tp_group, ep_group, dp_group = _groups[(tuple(replicas[rep]), "tp")], ep_groups[t], dp_groups[t]
    model = build_model(MOE, MODEL_SEED)
    apply_ep(model, ep_group, placement)
    apply_tp(model, tp_group, sequence_parallel=sequence_parallel)
    experts = set(expert_parameter_names(model))
    dense = [p for n, p in model.named_parameters() if n not in experts]
    opt = torch.optim.SGD(model.parameters(), lr=tpc.LR)
    gb = sum(rows)
    data = make_batches(MOE, STEPS, gb, DATA_SEED)
    lo, hi = sum(rows[:rep]), sum(rows[:rep + 1])
    losses, drops = [], []
    for s in range(STEPS):
        mine = data[s, lo:hi]
        loss = lm_loss_sum(model(mine[:, :-1]), mine[:, 1:]) / (gb * MOE.seq) + model.aux_loss()
        loss.backward()
        for p in dense:   # DP: SUM of the replicas' gradients (each already divided by global tokens)
            g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            dist.all_reduce(g, group=dp_group)
        opt.step()
        opt.zero_grad()
        total = loss.detach().clone().reshape(1)
        dist.all_reduce(total, group=dp_group)
        losses.append(total.item())
        drops.append([m.last_stats["dropped_global"] for _, m in moe_layers(model)])
    held = tp_full_state(model)
    ref, init_state, ref_losses = tpc.reference(MOE)
    return {"member": True, "ep_rank": dist.get_rank(ep_group), "replica": rep, "tp_index": t,
            "hosted": sorted({int(n.split("experts.")[1].split(".")[0]) for n in experts}),
            "sharded": sum(isinstance(p, DTensor) for p in model.parameters()),
            "param_diffs": {n: (held[n] - ref[n]).abs().max().item() for n in held},
            "moved": {n: (ref[n] - init_state[n]).abs().max().item() for n in held},
            "losses": losses, "ref_losses": ref_losses, "drops": drops}
