"""Tensor parallelism inside one sub-cluster, with torch's own `parallelize_module` / DTensor: column /
row parallel attention and MLP, sequence-parallel norms (Megatron-SP), never across chip kinds.

    from hal.strategies.tensor_parallel import apply_tp
    apply_tp(model_or_stage, tp_group, sequence_parallel=True, topology=topo)

The plan follows torchtitan's Llama plan (pytorch/torchtitan torchtitan/models/llama3/infra/
parallelize.py, `apply_tp`, read at commit 018740b), with the module names of hal.strategies.models.GPT:
    blocks[i].attn.wq / wk / wv   ColwiseParallel          (heads split: each TP rank owns heads/tp query
                                                           heads and kv_heads/tp K/V heads (GQA), so its
                                                           query heads' K/V heads are local; q/k/v biases
                                                           shard with them)
    blocks[i].attn.q_norm/k_norm  SequenceParallel(sequence_dim=2) (Qwen3: gains Replicate over inputs
                                                           sharded on the head dim, so their gradient
                                                           sums over every rank's heads)
    blocks[i].attn.wo             RowwiseParallel          (output Shard(1) with SP, else all-reduced)
    blocks[i].mlp.w1 / w3         ColwiseParallel
    blocks[i].mlp.w2              RowwiseParallel
    blocks[i].attn_norm/ffn_norm  SequenceParallel         (when sequence_parallel)
    blocks[i].attn / mlp / moe    PrepareModuleInput       (SP: all-gather the sequence before them)
    blocks[i].moe                 not sharded: it runs on the full activation, replicated over TP (its
                                  experts are spread by expert parallelism instead, see expert_parallel;
                                  its shared experts and gate are replicated too)
Stage boundaries carry FULL activations (every TP rank the same tensor): with sequence parallel the
first block of a stage takes its sequence chunk (a local slice, no communication) and the last block
all-gathers the sequence back, so a pipeline stage of any TP degree, the embedding, the final norm, the
head and the loss see ordinary replicated tensors (embedding, norm and head are not sharded: their
gradients are identical on every TP rank). The price against torchtitan's whole-model SP is one
extra all-gather per stage; the gain is that TP never leaks into PP or DP.

Kernels and DTensors (checked, decided): with use_local_output (torch's default for Colwise/Rowwise),
attention (rotary, scaled_dot_product_attention), silu and the MoE layer run on plain local tensors.
Only the sharded modules' own ops see DTensors: `hal.ops.linear` (HalLinear's forward) on the
column/row-sharded weights and `hal.ops.rms_norm` on the sequence-sharded norms. The emulated chips'
kernels (hal.ops.reference, hal.ops.torch_kernels) are plain torch ops, which DTensor dispatches;
a vendor kernel written as a custom op with no DTensor sharding rule would not be. `apply_tp` probes
the bound `linear` and `rms_norm` kernels on DTensors of the TP mesh once (no communication) and
raises TensorParallelError naming op, kernel and chip if one refuses, instead of failing mid-step.
Sequence parallel needs seq % tp == 0 (as torchtitan asserts: with use_local_output, SequenceParallel's
from_local infers the global length as local x tp, so uneven shards would mismatch the all-gathers);
apply_tp checks the model's seq and a pre-hook checks every input, with the numbers in the message.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleInputOutput,
                                               PrepareModuleOutput, RowwiseParallel, SequenceParallel,
                                               parallelize_module)

from hal.contract.errors import HalError


class TensorParallelError(HalError, ValueError):
    """A TP layout that cannot run: a group spanning chip kinds, sizes that do not divide."""


def tp_mesh(tp_group: dist.ProcessGroup, device_type: Optional[str] = None) -> DeviceMesh:
    """A 1-D DeviceMesh over the TP group (DeviceMesh.from_group), on this rank's torch device type."""
    if device_type is None:
        import hal
        device_type = hal.accelerator().device_type
    return DeviceMesh.from_group(tp_group, device_type)


def check_tp_group(tp_group: dist.ProcessGroup, topology=None) -> list[int]:
    """Global ranks of `tp_group`; TensorParallelError when they span chip kinds or sub-clusters.

    With a hal.core.topology.Topology the check needs no communication; without one the ranks exchange
    the chip they are bound to (all_gather_object over the group, bounded by its timeout)."""
    ranks = dist.get_process_group_ranks(tp_group)
    if topology is not None:
        check_tp_ranks(ranks, topology)
        return ranks
    import hal
    chips = [None] * len(ranks)
    dist.all_gather_object(chips, hal.accelerator().chip.name, group=tp_group)
    _refuse_mixed(ranks, chips, chips)
    return ranks


def check_tp_ranks(ranks: list[int], topology) -> None:
    """TensorParallelError when global `ranks` span chip kinds or sub-clusters of `topology`
    (hal.core.topology.Topology); no communication."""
    _refuse_mixed(ranks, [topology.chip_of(r) for r in ranks], [topology.sub_cluster_of(r).name for r in ranks])


def _refuse_mixed(ranks: list[int], chips: list, places: list) -> None:
    if len(set(chips)) > 1 or len(set(places)) > 1:
        where = ", ".join(f"rank {r}: {c}" + (f" ({p})" if p != c else "") for r, c, p in zip(ranks, chips, places))
        raise TensorParallelError(
            f"TP group {ranks} spans {'chip kinds' if len(set(chips)) > 1 else 'sub-clusters'} ({where}); "
            f"tensor parallelism runs inside one sub-cluster only (its all-reduces/all-gathers sit on every "
            f"layer's critical path; across chips they would cross the bridge) - use PP or DP across chips")


def _check_divides(model: nn.Module, tp: int) -> None:
    for name, block in _blocks(model):
        attn = block.attn
        hd = getattr(attn, "head_dim", None)
        out = attn.wq.out_features
        if hd:
            heads, kv = out // hd, attn.wk.out_features // hd
            if heads % tp:
                raise TensorParallelError(f"{name}.attn: {heads} attention heads (wq {out} = {heads} x head_dim "
                                          f"{hd}) do not divide by the TP degree {tp}")
            if kv % tp:
                raise TensorParallelError(f"{name}.attn: {kv} key/value heads (wk {attn.wk.out_features} = {kv} x "
                                          f"head_dim {hd}) do not divide by the TP degree {tp}; each TP rank needs "
                                          f"whole K/V heads (GQA: kv_heads % tp == 0)")
        for lin in ("wq", "wk", "wv"):
            n = getattr(attn, lin).out_features
            if n % tp:
                raise TensorParallelError(f"{name}.attn.{lin}: {n} output features do not divide by TP degree {tp}")
        if hasattr(block, "mlp"):
            n = block.mlp.w1.out_features
            if n % tp:
                raise TensorParallelError(f"{name}.mlp: ffn width {n} does not divide by TP degree {tp}")


def _blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, block) of the decoder blocks: `model.blocks` (a ModuleList or ModuleDict), or the model
    itself when it is one block (has `.attn`)."""
    if hasattr(model, "attn"):
        return [("", model)]
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        raise TensorParallelError(f"apply_tp: {type(model).__name__} has neither .blocks nor .attn "
                                  f"(expected hal.strategies.models.GPT, a stage of it, or one Block)")
    items = blocks.items() if isinstance(blocks, nn.ModuleDict) else enumerate(blocks)
    return [(f"blocks.{k}", b) for k, b in items]


def block_plan(block: nn.Module, sequence_parallel: bool, first: bool, last: bool) -> dict:
    """parallelize_module plan for one decoder block (names relative to the block)."""
    ffn = "moe" if hasattr(block, "moe") else "mlp"
    seq, rep = Shard(1), Replicate()
    plan: dict = {"attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(), "attn.wv": ColwiseParallel(),
                  "attn.wo": RowwiseParallel(output_layouts=seq if sequence_parallel else rep)}
    if ffn == "mlp":
        plan.update({"mlp.w1": ColwiseParallel(), "mlp.w3": ColwiseParallel(),
                     "mlp.w2": RowwiseParallel(output_layouts=seq if sequence_parallel else rep)})
    if hasattr(block.attn, "q_norm"):
        # q/k norms (one gain over head_dim shared by all heads) see this rank's heads only: their gains
        # are Replicate DTensors on inputs sharded on the head dim (2 of (b, s, heads, d)), so DTensor
        # sums the gains' gradient over the TP ranks' heads, as the single-process model does
        for norm in ("attn.q_norm", "attn.k_norm"):
            plan[norm] = SequenceParallel(sequence_dim=2, use_local_output=True)
    if not sequence_parallel:
        return plan
    plan.update({
        "attn_norm": SequenceParallel(), "ffn_norm": SequenceParallel(),
        # attention needs the whole sequence: all-gather the norm's sequence shards (cos, sin as is)
        "attn": PrepareModuleInput(input_layouts=(seq, None, None), desired_input_layouts=(rep, None, None)),
    })
    if ffn == "mlp":
        plan["mlp"] = PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(rep,))
    else:  # the MoE layer is not sharded: full sequence in, our sequence chunk of its output out
        plan["moe"] = PrepareModuleInputOutput(input_layouts=(seq,), desired_input_layouts=(rep,),
                                               use_local_input=True, output_layouts=(rep,),
                                               desired_output_layouts=(seq,), use_local_output=True)
    # stage boundaries carry full activations: chunk at the first block, gather after the last
    if first and last:
        plan[""] = PrepareModuleInputOutput(input_layouts=(rep, None, None), desired_input_layouts=(seq, None, None),
                                            use_local_input=True, output_layouts=(seq,),
                                            desired_output_layouts=(rep,), use_local_output=True)
    elif first:
        plan[""] = PrepareModuleInput(input_layouts=(rep, None, None), desired_input_layouts=(seq, None, None),
                                      use_local_output=True)
    elif last:
        plan[""] = PrepareModuleOutput(output_layouts=(seq,), desired_output_layouts=(rep,), use_local_output=True)
    return plan


def _sequence_check(tp: int, where: str):
    """Forward pre-hook of a stage's first block: the sequence must split in equal shards (DTensor's
    from_local in SequenceParallel infers the global length as local x tp)."""
    def hook(module, args):
        s = args[0].size(1)
        if s % tp:
            raise TensorParallelError(f"{where}: sequence length {s} of input {tuple(args[0].shape)} does not "
                                      f"divide by the TP degree {tp} under sequence parallelism")
    return hook


def probe_kernels(mesh: DeviceMesh) -> None:
    """Run the bound hal.ops linear and rms_norm kernels on tiny DTensors laid out as TP lays them
    out (no communication); TensorParallelError naming op, kernel and chip if one refuses DTensors."""
    import hal
    import hal.ops as ops
    tp = mesh.size()
    dev = hal.accelerator().device_type
    x = DTensor.from_local(torch.ones(1, 2, 4, device=dev), mesh, [Replicate()], run_check=False)
    w = DTensor.from_local(torch.ones(2, 4, device=dev), mesh, [Shard(0)], run_check=False)
    g = DTensor.from_local(torch.ones(4, device=dev), mesh, [Replicate()], run_check=False)
    xs = DTensor.from_local(torch.ones(1, 2, 4, device=dev), mesh, [Shard(1)], run_check=False)
    bound = ops.bound_kernels()
    for op, call, want in (("linear", lambda: ops.linear(x, w), (1, 2, 2 * tp)),
                           ("rms_norm", lambda: ops.rms_norm(xs, g), (1, 2 * tp, 4))):
        try:
            out = call()
            if not isinstance(out, DTensor) or tuple(out.shape) != want:
                raise TypeError(f"returned {type(out).__name__} of shape {tuple(out.shape)}, expected a DTensor {want}")
        except Exception as exc:  # any refusal: report it typed, with the kernel's name
            kernel = bound[op].describe() if op in bound else "?"
            raise TensorParallelError(
                f"hal.ops.{op} kernel {kernel} on chip {hal.accelerator().chip.name!r} does not accept DTensors "
                f"({type(exc).__name__}: {exc}); tensor parallelism needs it to (register a DTensor sharding "
                f"rule for the custom op, or a plain-torch kernel at higher priority)") from None


def apply_tp(model: nn.Module, tp_group: Optional[dist.ProcessGroup] = None, sequence_parallel: bool = True,
             topology=None, device_type: Optional[str] = None, check_kernels: bool = True,
             mesh: Optional[DeviceMesh] = None) -> DeviceMesh:
    """Shard `model` (a GPT, a pipeline stage of it, or one Block) over `tp_group` in place.

    Checks first, with the numbers in TensorParallelError: the group lies in one sub-cluster (one chip
    kind), query heads, key/value heads and ffn width divide by the TP degree. Parameters of the sharded modules become
    DTensors on the returned 1-D mesh (attention/MLP linears Shard(0)/Shard(1), norms Replicate when
    sequence_parallel); the forward of the model is unchanged for its caller (full activations in
    and out). A 1-rank group still makes the sharded parameters DTensors (of full size).

    `mesh`: a 1-D DeviceMesh to shard on instead of DeviceMesh.from_group(tp_group), e.g. the "tp"
    dimension of a 2-D ("dp", "tp") mesh, which FSDP2 on top of TP needs (torch 2.13's fully_shard
    concatenates the DP and TP meshes, so both must come from one parent); tp_group defaults to its group."""
    if mesh is not None:
        if mesh.ndim != 1:
            raise TensorParallelError(f"apply_tp: mesh has {mesh.ndim} dimensions {mesh.mesh_dim_names}; "
                                      f"pass its TP dimension, e.g. mesh['tp']")
        tp_group = mesh.get_group() if tp_group is None else tp_group
        if mesh.size() != dist.get_world_size(tp_group):
            raise TensorParallelError(f"apply_tp: mesh of size {mesh.size()} but tp_group of size "
                                      f"{dist.get_world_size(tp_group)}")
    if tp_group is None:
        raise TensorParallelError("apply_tp: give tp_group or mesh")
    check_tp_group(tp_group, topology)
    tp = dist.get_world_size(tp_group)
    _check_divides(model, tp)
    mesh = mesh if mesh is not None else tp_mesh(tp_group, device_type)
    if check_kernels:
        probe_kernels(mesh)
    blocks = _blocks(model)
    if sequence_parallel and tp > 1:
        seq = getattr(getattr(model, "cfg", None), "seq", None)
        if seq is not None and seq % tp:
            raise TensorParallelError(f"sequence parallel: the model's seq = {seq} does not divide by the TP "
                                      f"degree {tp} (shards must be equal; use a multiple of {tp} or "
                                      f"sequence_parallel=False)")
        blocks[0][1].register_forward_pre_hook(_sequence_check(tp, blocks[0][0] or "block"))
    for i, (name, block) in enumerate(blocks):
        plan = block_plan(block, sequence_parallel, first=i == 0, last=i == len(blocks) - 1)
        parallelize_module(block, mesh, plan)
    return mesh


def tp_full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter as a full (unsharded) tensor: DTensors are gathered over their mesh
    (a collective: every rank of the TP group must call it)."""
    return {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
            for n, p in model.named_parameters()}
