"""Functions the tensor-parallel tests run on every rank of a WorkerPool (module level).

A case trains hal.strategies.models.GPT (tiny config, dense or MoE) for STEPS SGD steps with
hal.strategies.tensor_parallel.apply_tp over this rank's TP group (a `hetero` subgroup inside one
sub-cluster), every TP rank on the whole global batch, then gathers the DTensor parameters to full
tensors and compares them with a single-process run of the same model computed right here.
SGD, not Adam: Adam's update is invariant to the gradient's scale and would hide a doubled gradient.
"""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from hal.strategies.models import ModelConfig, build_model, lm_loss, make_batches

DENSE = ModelConfig(name="tp-tiny", layers=2, hidden=48, heads=6, ffn=96, vocab=64, seq=12)
MOE = ModelConfig(name="tp-tiny-moe", layers=2, hidden=48, heads=6, ffn=36, vocab=64, seq=12, experts=4,
                  top_k=2, capacity_factor=1.0, moe_aux_loss_coef=0.1)
# every family feature at once (GQA 12 query / 6 K/V heads of 4 dims, q/k/v biases, q/k norms, llama3 rope
# scaling, tied head, MoE with a gated shared expert and raw top-k gates): TP 3 and 2 divide both head counts
FAMILY = ModelConfig(name="tp-tiny-family", layers=2, hidden=48, heads=12, kv_heads=6, ffn=36, vocab=64, seq=12,
                     qkv_bias=True, qk_norm=True, tie_embeddings=True, experts=4, top_k=2, capacity_factor=1.0,
                     shared_experts=1, shared_ffn=24, shared_expert_gate=True, norm_topk_prob=False,
                     rope_scaling=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=4))
CFGS = {"dense": DENSE, "moe": MOE, "family": FAMILY}
MODEL_SEED, DATA_SEED = 0, 1
STEPS, GLOBAL_BATCH, LR = 3, 4, 1.0

_groups: dict = {}


def init(timeout_s: float = 120.0) -> dict:
    import hal
    import hal.ccl_bridge  # noqa: F401 - registers the backend
    if not dist.is_initialized():
        dist.init_process_group("hetero", timeout=timedelta(seconds=timeout_s))
    acc = hal.accelerator()
    return {"rank": dist.get_rank(), "chip": acc.chip.name, "emulated": acc.emulated}


def groups_of(partition: list) -> dist.ProcessGroup:
    """Create a hetero new_group for every rank list of `partition` (every world rank creates all of
    them, in the same order); return the one holding this rank."""
    mine = None
    for ranks in partition:
        key = tuple(ranks)
        if key not in _groups:
            _groups[key] = dist.new_group(list(ranks), backend="hetero", timeout=timedelta(seconds=120))
        if dist.get_rank() in ranks:
            mine = _groups[key]
    return mine


def _loss(model, batch, cfg):
    loss = lm_loss(model(batch[:, :-1]), batch[:, 1:])
    aux = model.aux_loss()
    return loss if aux is None else loss + aux


def reference(cfg: ModelConfig):
    model = build_model(cfg, MODEL_SEED)
    init_state = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    data = make_batches(cfg, STEPS, GLOBAL_BATCH, DATA_SEED)
    losses = []
    for s in range(STEPS):
        loss = _loss(model, data[s], cfg)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {n: p.detach().clone() for n, p in model.named_parameters()}, init_state, losses


def train_tp(partition: list, kind: str, sequence_parallel: bool) -> dict:
    """TP over this rank's group of `partition` (each group trains the same model independently)."""
    from torch.distributed.tensor import DTensor

    from hal.strategies.tensor_parallel import apply_tp, tp_full_state
    cfg = CFGS[kind]
    group = groups_of(partition)
    model = build_model(cfg, MODEL_SEED)
    apply_tp(model, group, sequence_parallel=sequence_parallel)
    sharded = sorted(n for n, p in model.named_parameters() if isinstance(p, DTensor))
    local_shapes = {n: tuple(p.to_local().shape) for n, p in model.named_parameters() if isinstance(p, DTensor)}
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    data = make_batches(cfg, STEPS, GLOBAL_BATCH, DATA_SEED)
    losses = []
    for s in range(STEPS):
        loss = _loss(model, data[s], cfg)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    held = tp_full_state(model)
    ref, init_state, ref_losses = reference(cfg)
    return {"tp": dist.get_world_size(group), "sharded": sharded, "local_shapes": local_shapes,
            "param_diffs": {n: (held[n] - ref[n]).abs().max().item() for n in held},
            "moved": {n: (ref[n] - init_state[n]).abs().max().item() for n in held},
            "names": sorted(held), "losses": losses, "ref_losses": ref_losses}


def tp_error(partition: list, with_topology: bool, kind: str = "dense", heads: int = 0):
    """apply_tp on this rank's group; return the error's type and message (None if it passed)."""
    from hal.core.topology import Topology
    from hal.strategies.tensor_parallel import apply_tp
    group = groups_of(partition)
    cfg = CFGS[kind] if not heads else DENSE.model_copy(update={"heads": heads, "hidden": heads * 8})
    topo = None
    if with_topology:
        import os
        topo = Topology.from_env(world_size=int(os.environ["WORLD_SIZE"]))
    try:
        apply_tp(build_model(cfg, MODEL_SEED), group, topology=topo)
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return None


def probe_refusal(partition: list):
    """probe_kernels with the bound hal.ops.linear swapped for one that refuses DTensors (as a vendor
    custom op without a DTensor sharding rule does): the typed error, or None if nothing was raised."""
    import hal.ops as ops
    from torch.distributed.tensor import DTensor
    from hal.strategies.tensor_parallel import TensorParallelError, probe_kernels, tp_mesh
    mesh = tp_mesh(groups_of(partition))
    probe_kernels(mesh)  # the emulated chip's own kernels accept DTensors
    bound = ops._linear

    def picky(x, weight, bias=None):
        if isinstance(x, DTensor) or isinstance(weight, DTensor):
            raise RuntimeError("Operator vendor::fused_linear does not have a sharding strategy registered")
        return bound(x, weight, bias)
    ops._linear = picky  # the module global the ops.linear forwarder reads
    try:
        probe_kernels(mesh)
    except TensorParallelError as exc:
        return str(exc)
    finally:
        ops._linear = bound
    return None
