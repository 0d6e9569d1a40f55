"""The cost model: time and memory of one replica's share of a training step, from the model's
per-layer counts and a sub-cluster's figures (`facts.ChipFacts`).

Conventions (each a stated assumption, printed in docs/planner.md):
  - bf16 weights and activations, fp32 gradients reduced across DP (as Megatron-LM does by default),
    mixed-precision AdamW: 16 bytes/param replicated; ZeRO-2 2 + 14/d; ZeRO-3 16/d (REFERENCE.md).
  - forward FLOPs of a layer = 2 x its matmul parameters per token + 4 s h per token for attention;
    backward = 2 x forward; full recompute adds one forward, selective recompute (Korthikanti et al.
    2022) the attention core's forward and the memory-bound ops (apply_plan keeps only GEMM
    outputs). Each GEMM is timed at the chip efficiency matrix's fraction
    of peak for its (m, n, k) (hal.core.chip_matrix), the attention core at the matrix's attention
    fraction, memory-bound work at the matrix's share of the memory bandwidth (ChipFacts.memory_bw).
  - the loss on the last stage: its fp32 s x vocab tensors written and read once, at the memory bandwidth
    (loss_bytes), half forward and half backward; the same tensors its memory term counts.
  - activations: ModelConfig.activation_bytes(attention="fused") (REFERENCE.md without the s x s
    score term); full recompute keeps 2 s h per layer (the input).
  - tensor parallel costs 4 all-reduce-equivalents of b s h bf16 per layer per micro-batch (2 forward,
    2 backward) on the intra-node link, not overlapped with compute (apply_plan's TP; a published
    Megatron-Core run's --tp-comm-overlap: ModelFacts(tp_overlap=True)).
  - MoE: the router's softmax/top-k and the token permute / local-expert sort / un-permute are
    memory-bound passes (moe_dispatch_bytes), charged forward and again backward; the EP all_to_all
    is never overlapped (apply_plan's, and Megatron-Core's without its opt-in EP overlap).
  - other runtimes, for published runs: ModelFacts(sequence_parallel=, fused_attention=, vocab_parallel=).
  - a fused kernel's attention core does only the causal share of the 4 s h count, s(s + 1)/(2 s^2), and on
    sliding-window layers (ModelConfig.sliding_window / layer_types) the window's (attention_work_share);
    the unfused core computes the whole s x s matrix. The model FLOPs (MFU) keep the full 4 s h count, the
    convention published runs report in (Megatron-LM's 72 B s l h^2 (1 + s/6h + ...), PaLM's 6N + 12 L H Q T).
  - collectives use the ring / hierarchical formulas of nccl-tests and the bridge (hal.collectives'
    busbw factors): all_reduce moves 2(n-1)/n of the buffer per rank.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from hal.core.chip_matrix import fused_attention_share, gemm_shapes
from hal.core.efficiency import busbw_factor

from .facts import ChipFacts

BF16 = 2
GRAD_BYTES = 4          # fp32 gradients on the wire (reduce in fp32)
ADAM_TRAFFIC = 28       # bytes read+written per parameter by a fused AdamW step (p, g, m, v fp32)
ELEMENTWISE_PASSES = 2  # activation bytes are written once and read once by the memory-bound ops
LOSS_COPIES = 4          # logits, log-softmax, and their gradients (s x vocab fp32 each, per row)
FP32 = 4
# an unfused attention core's forward traffic per score element (16-bit): the QK^T GEMM writes the scores
# (2), the fused scale-mask-softmax reads them and writes the probabilities (4), dropout reads them and
# writes its output and its 1-byte mask (5), the AV GEMM reads them (2) (Megatron-LM's 2021-22 core)
SCORE_BYTES = 13
BRIDGE_STAGING = 2 * 64 * 2**20   # the bridge's preallocated host/device staging slots per rank
ROUTER_BYTES = 4        # the router's softmax and top-k run in fp32 (Megatron-Core's topk_softmax_with_capacity)
INDEX_BYTES = 8         # an int64 expert index per routed row


class ModelFacts:
    """A model config's counts as the cost model asks for them, per sample (one sequence).

    Parameters, FLOPs and activation bytes come from `hal.strategies.models.ModelConfig` (one
    definition); activations with `attention="fused"`: torch's SDPA on CUDA/NPU keeps no scores."""

    def __init__(self, cfg, dtype_bytes: int = BF16, op_profile=None, vocab_parallel: bool = False,
                 sequence_parallel: bool = False, fused_attention: bool = True, tp_overlap: bool = False,
                 shard_expert_state: bool = False,
                 fused_swiglu: bool = False, megatron_p2p: bool = False, keeps_stage_outputs: bool = True) -> None:
        self.cfg = cfg
        # the embedding, head and loss sharded over TP (Megatron-LM's vocab-parallel layers), as a
        # published run laid out by Megatron-LM has them; False: whole on every TP rank, as apply_plan runs
        self.vocab_parallel = vocab_parallel
        # Megatron-LM's sequence parallelism (Korthikanti et al. 2022): the norms, dropouts and residuals
        # between the TP regions keep 1/t of the sequence, so every activation a layer keeps is / t
        # (their 34 s b h / t); False: ModelConfig's 10 s b h of them whole on every TP rank (apply_plan)
        self.sequence_parallel = sequence_parallel
        # a flash-style attention kernel (torch's SDPA; FlashAttention, 2022 on): the core at the matrix's
        # attention fraction, no score tensor kept. False (Megatron-LM before FlashAttention): the core
        # as two batched GEMMs per head, (s, s, d) and (s, d, s), at the matrix's GEMM fraction, and the
        # a x s x s score tensor written and read through memory (SCORE_BYTES per element, forward)
        self.fused_attention = fused_attention
        # Megatron-Core's --tp-comm-overlap (Transformer Engine's userbuffers): a layer's TP all-gathers
        # and reduce-scatters run under its GEMMs, so only what exceeds the compute is exposed. False:
        # apply_plan's DTensor TP, whose collectives wait (the default)
        self.tp_overlap = tp_overlap
        # Megatron-Core's distributed optimizer keeps expert parameters in their own buffers over the
        # expert-DP group (megatron/core/distributed/distributed_data_parallel.py at c230e0d7c2, l. 231-236:
        # `expert_parallel_buffers` on get_data_modulo_expert_parallel_group) and shards their state there
        # as it shards the dense state over DP: at ZeRO >= 1 an expert parameter costs the ZeRO level's
        # bytes over the dp / ep copies. False: apply_plan, whose DDP/FSDP2 leave experts out (16 B each)
        self.shard_expert_state = shard_expert_state
        # a fused SwiGLU kernel that keeps only its input (Megatron-Core's BiasSwiGLUFunction): the MLP keeps
        # 6f bytes per token instead of eager autograd's 8f (ModelConfig.mlp_activation_bytes); False: apply_plan
        self.fused_swiglu = fused_swiglu
        # Megatron-LM's pipeline p2p (megatron/p2p_communication.py _communicate, 2021-22; Megatron-Core's
        # default batch_p2p_sync): every send and receive is waited on and followed by torch.cuda.synchronize(),
        # so a stage's compute stream waits for its own sends; without sequence parallelism the scatter/gather
        # optimisation (Narayanan et al. 2021, section 4.1) sends 1/t per TP rank and the receiver all-gathers
        # it over TP before computing (`_megatron_p2p_seconds`). False: asynchronous sends (apply_plan; Llama 3)
        self.megatron_p2p = megatron_p2p
        # a pipeline stage keeps each in-flight micro-batch's output until its backward: apply_plan's runtimes
        # do (HeteroPipeline's `saved[m] = (x, out)`, torch PipelineStage's fwd_cache), one b s h tensor per
        # chunk micro-batch alive beyond what the layers saved. False: Megatron-LM's deallocate_output_tensor
        # and Llama 3's "proactively deallocate ... the output tensors of each pipeline stage" (published runs)
        self.keeps_stage_outputs = keeps_stage_outputs
        # an op_profile.OpProfile: price compute op by op (a roofline per op) instead of from totals
        self.op_profile = op_profile
        # bytes per activation element (2: bf16 training; 4: an fp32 run, e.g. emulated on a CPU)
        self.dtype_bytes = dtype_bytes
        self.name, self.layers, self.hidden, self.heads = cfg.name, cfg.layers, cfg.hidden, cfg.heads
        self.ffn, self.vocab, self.seq = cfg.ffn, cfg.vocab, cfg.seq
        self.experts = cfg.experts
        self.top_k = cfg.top_k if cfg.experts else 0
        self.layer_params = cfg.layer_params()
        self.expert_params = 3 * cfg.hidden * cfg.ffn          # one SwiGLU expert (w1, w3, w2)
        self.embed_params = cfg.embed_params()
        self.total_params = cfg.num_params()
        self._layer_fwd = float(cfg.layer_forward_flops(cfg.seq))
        self._head_fwd = cfg.head_flops(cfg.seq) / 3
        # query and key/value projection widths (GQA: kv < q); without GQA fields both are hidden
        self.q_dim = int(getattr(cfg, "q_dim", cfg.hidden))
        self.kv_dim = int(getattr(cfg, "kv_dim", cfg.hidden))
        # the attention core's work per layer as a share of the full 4 s h count (causal, sliding window;
        # fused kernels only: the unfused core computes the whole s x s score matrix before masking it)
        self.attention_share = attention_work_share(cfg) if fused_attention else 1.0
        self._act = {}

    @classmethod
    def from_config(cls, cfg) -> "ModelFacts":
        return cls(cfg)

    def layer_fwd_flops(self) -> float:
        return self._layer_fwd

    def head_fwd_flops(self) -> float:
        return self._head_fwd

    def step_flops_per_sample(self) -> float:
        """Model FLOPs of one sample's forward and backward (no recompute): the MFU numerator."""
        return float(self.cfg.train_flops(self.seq))

    def act_bytes(self, tp: int, recompute) -> float:
        """Activation bytes one layer keeps for backward per sample (fused attention: no scores).
        Selective recompute drops only the attention scores, which a fused kernel never keeps, so
        its memory here is that of no recompute (its cost is the attention core's forward again)."""
        rk = recompute_kind(recompute)
        kind = "full" if rk == "full" else "none"
        # an unfused core keeps its scores unless selective recompute drops them (Korthikanti et al.)
        attention = "materialized" if rk == "none" and not self.fused_attention else "fused"
        key = (tp, kind, attention)
        if key not in self._act:
            kw = dict(attention=attention, fused_swiglu=self.fused_swiglu)
            whole = self.cfg.activation_bytes(1, 1, kind, **kw) / tp if self.sequence_parallel \
                else self.cfg.activation_bytes(1, tp, kind, **kw)
            self._act[key] = whole * self.dtype_bytes / BF16    # ModelConfig counts 16-bit activations
        return self._act[key]

    def dispatched_act_bytes(self) -> float:
        """Of one sample's `act_bytes`, what the MoE router and dispatch passes write and read (the
        router's softmax, the routed rows: ModelConfig.moe_activation_parts), which
        `moe_dispatch_bytes` prices, so the elementwise estimate leaves them out; 0 for a dense model."""
        parts = self.cfg.moe_activation_parts(self.fused_swiglu) if self.experts else {}
        return (parts.get("router", 0.0) + parts.get("rows", 0.0)) * self.seq * self.dtype_bytes / BF16

    def boundary_bytes(self) -> float:
        """Bytes of one sample's activation crossing a pipeline boundary (b s h elements)."""
        return self.dtype_bytes * self.seq * self.hidden


RECOMPUTE_KINDS = ("none", "selective", "full")


def recompute_kind(recompute) -> str:
    """'none' | 'selective' | 'full' from a Plan's name or a bool (True: full)."""
    if recompute is True:
        return "full"
    if recompute is False or recompute is None:
        return "none"
    if recompute not in RECOMPUTE_KINDS:
        raise ValueError(f"recompute = {recompute!r}; expected one of {RECOMPUTE_KINDS}")
    return str(recompute)


@dataclass
class ReplicaCost:
    """One replica of one stage: per micro-batch forward/backward seconds and its memory."""

    fwd: float
    bwd: float
    tp_comm: float          # inside fwd+bwd, reported separately
    ep_comm: float          # inside fwd+bwd
    params_local: float     # parameters this rank holds before sharding
    memory: float           # peak bytes per rank
    optimizer: float        # seconds for the optimizer step
    grad_acc: float = 0.0   # extra seconds of a backward after the first of a step (adds into .grad)
    # MoE: the expert parameters among params_local (whole on every TP rank; not DDP/FSDP2's: no
    # ZeRO sharding, reduced only across expert-DP copies)
    expert_params_local: float = 0.0
    # of `bwd`, the weight-gradient GEMMs (zero-bubble schedules run them apart, as W): the forward's
    # GEMM seconds, the attention core excluded (it has no weights); Qi et al. 2023, arXiv 2401.10241, s. 2
    bwd_weight: float = 0.0


def allreduce_time(nbytes: float, n: int, bw: float, lat: float = 0.0) -> float:
    """Ring all-reduce: 2(n-1) steps, each one message (latency `lat`) of nbytes/n; the bytes term is
    nccl-tests' busbw relation (time = bytes x busbw_factor / bus bandwidth, hal.core.efficiency's one table)."""
    return 0.0 if n <= 1 else 2 * (n - 1) * lat + busbw_factor("all_reduce", n) * nbytes / bw


def gather_time(nbytes: float, n: int, bw: float, lat: float = 0.0) -> float:
    """all_gather or reduce_scatter of an n-way sharded buffer of nbytes total (ring: n-1 steps)."""
    return 0.0 if n <= 1 else (n - 1) * lat + busbw_factor("all_gather", n) * nbytes / bw


def group_bw(facts: ChipFacts, one_node: bool) -> float:
    """Per-rank bandwidth of a collective among ranks of one sub-cluster: the intra-node link when
    they share a node, the rank's NIC (its rail) otherwise. The simulator knows the ranks
    (layout.on_one_node); the search knows counts only (its TP groups are consecutive ranks, so a
    group of n x tp ranks shares a node when it fits one)."""
    return facts.intra_bw if one_node else facts.nic_bw


def dp_reduce_time(nbytes: float, parts: Sequence[tuple[ChipFacts, int, float]]) -> float:
    """Gradient all-reduce of nbytes over a DP group made of `parts` = (facts, members in that
    sub-cluster, their per-rank bandwidth). One part: a ring. Several: the bridge's rail algorithm
    (intra reduce-scatter, device->host, rail all-reduce across the k parts, host->device, intra
    all-gather); the smallest part carries the largest share per rank."""
    if len(parts) == 1:
        f, n, bw = parts[0]
        return allreduce_time(nbytes, n, bw, f.link_latency)
    k = len(parts)
    # a rail's bandwidth: hal.core.topology's Topology.rail_bandwidth (ChipFacts.rail_bw, facts.with_rails)
    rail_bw = min(f.rail_bw or f.nic_bw for f, _, _ in parts)
    lat = max(f.link_latency for f, _, _ in parts)
    if not rails_for(tuple(n for _, n, _ in parts)):
        # leader-only bridge (more parts than its max_parts, hal.core.topology.rail_layout): intra reduce to
        # one leader, the whole buffer across on the leader rail, intra broadcast
        intra = max(2 * gather_time(nbytes, n, bw, f.link_latency) for f, n, bw in parts)
        copies = max(2 * nbytes / f.host_copy_bw for f, _, _ in parts)
        return intra + copies + allreduce_time(nbytes, k, rail_bw, lat)
    intra = max(2 * gather_time(nbytes, n, bw, f.link_latency) for f, n, bw in parts)
    share = max(nbytes / n for _, n, _ in parts)
    copies = max(2 * share / f.host_copy_bw for f, _, _ in parts)
    cross = allreduce_time(share, k, rail_bw, lat)
    return intra + copies + cross


_RAILS: dict = {}


def rails_for(sizes: tuple[int, ...]) -> bool:
    """Whether the bridge runs its rails (True) or only the leader rail for a group whose chip groups
    have `sizes` ranks: hal.core.topology.rail_layout's rule (parts = lcm of the sizes <= max_parts)."""
    if sizes not in _RAILS:
        from hal.core.topology import rail_layout
        keys = [(f"part{i}", False) for i, n in enumerate(sizes) for _ in range(n)]
        _RAILS[sizes] = rail_layout(keys).rail_mode
    return _RAILS[sizes]


def p2p_time(nbytes: float, src: ChipFacts, dst: ChipFacts, same_node: bool) -> float:
    """Pipeline send of nbytes; across chips the bridge stages through host memory on both sides."""
    lat = max(src.link_latency, dst.link_latency)
    if src is dst or src.name == dst.name:
        return lat + nbytes / (src.intra_bw if same_node else src.nic_bw)
    return lat + nbytes / src.host_copy_bw + nbytes / min(src.nic_bw, dst.nic_bw) + nbytes / dst.host_copy_bw


_CACHE: dict = {}


def replica_cost(m: ModelFacts, *args, **kwargs) -> "ReplicaCost":
    """`_replica_cost`, memoised: a search asks for the same (model, chip, shape) many times. The
    returned object is shared; callers copy it before changing it."""
    key = (id(m), id(args[0])) + tuple(args[1:]) + tuple(sorted(kwargs.items()))
    hit = _CACHE.get(key)
    if hit is None:
        if len(_CACHE) > 200_000:
            _CACHE.clear()
        hit = _CACHE[key] = (m, args[0], _replica_cost(m, *args, **kwargs))   # keep m, f alive: ids stay unique
    return hit[2]


def _replica_cost(m: ModelFacts, f: ChipFacts, tp: int, n_layers: int, first: bool, last: bool, mb: int,
                 recompute: bool, zero: int, dp: int, in_flight: int, tp_bw: Optional[float] = None,
                 ep: Optional[tuple[int, float]] = None, experts_local: Optional[int] = None,
                 group_mb: Optional[int] = None, outputs_alive: float = 0.0) -> ReplicaCost:
    """Cost of a replica (TP group of `tp` ranks of chip `f`) running `n_layers` layers for a
    micro-batch of `mb` samples. `dp` is the size of its DP group (for ZeRO sharding), `in_flight`
    the micro-batches whose activations it holds at the peak (1F1B: min(m, p - stage)). MoE: `ep` =
    (EP group size, per-rank all_to_all bandwidth); the replica hosts `experts_local` of the
    model's experts and, with a balanced router, computes that share of the whole EP group's
    routed tokens (`group_mb` samples per micro-batch), whatever its own micro-batch. `outputs_alive`: the
    stage (chunk) outputs of micro-batches it keeps at the peak (ModelFacts.keeps_stage_outputs)."""
    tp_bw = tp_bw if tp_bw is not None else f.intra_bw
    kind = recompute_kind(recompute)
    compute_fwd, elementwise, attn = _forward_seconds(m, f, tp, n_layers, last, mb, experts_local, group_mb)
    tp_comm, ep_comm = _comm_seconds(m, f, tp, n_layers, mb, tp_bw, ep)
    tp_f = tp_b = tp_comm / 2            # exposed TP communication of a forward, of a backward
    if m.tp_overlap:                     # hidden under the pass's GEMMs (backward: twice the forward's)
        tp_f, tp_b = max(0.0, tp_f - compute_fwd), max(0.0, tp_b - 2 * compute_fwd)
        tp_comm = tp_f + tp_b            # what the step waits for (the statistics' communication)
    # MoE router and dispatch passes: memory-bound, the same bytes forward and backward (moe_dispatch_bytes)
    dispatch = n_layers * moe_dispatch_bytes(m, mb, experts_local, ep) / f.memory_bw
    loss = loss_bytes(m, tp, mb) / 2 / f.memory_bw if last else 0.0
    fwd = compute_fwd + elementwise + dispatch + loss + tp_f + ep_comm / 2
    bwd = 2 * compute_fwd + 2 * elementwise + dispatch + loss + tp_b + ep_comm / 2
    if m.megatron_p2p:                 # synchronous sends, the receiver's gather (ModelFacts.megatron_p2p)
        send, gathered = _megatron_p2p_seconds(m, f, tp, mb, tp_bw)
        fwd += (0.0 if last else send) + (0.0 if first else gathered)
        bwd += (0.0 if first else send) + (0.0 if last else gathered)
    if kind == "full":
        bwd += compute_fwd + elementwise + dispatch + tp_f + ep_comm / 2
    elif kind == "selective":     # apply_plan re-runs the attention core and the memory-bound ops
        bwd += attn + elementwise
    op_opt = grad_acc = None
    if m.op_profile is not None and not m.experts:     # op by op (op_profile.py); comm as above
        from .op_profile import stage_seconds
        pf, pb, op_opt, grad_acc = stage_seconds(m.op_profile, f.flops, f.memory_bw, tp, n_layers, first, last, mb,
                                                 kind == "full", f.matrix)
        fwd, bwd = pf + (tp_comm + ep_comm) / 2, pb + (tp_comm + ep_comm) / 2
    dense, eparams, layer_p = _local_params(m, tp, n_layers, first, last, experts_local)
    # the expert-DP group: the copies of this replica's experts (dp / e; one EP group over DP: none)
    edp = max(1, dp // ep[0]) if ep is not None and ep[0] >= 1 else 1
    eshard = edp if m.shard_expert_state and zero >= 1 else 1
    memory = _memory_bytes(m, tp, n_layers, last, mb, recompute, zero, dp, in_flight, dense, eparams, layer_p,
                           eshard)
    if m.keeps_stage_outputs and outputs_alive > 0:     # b s h each, / t where sequence parallel splits it
        memory += outputs_alive * m.boundary_bytes() * mb / (tp if m.sequence_parallel else 1)
    shard = dp if zero >= 1 else 1
    # the optimizer steps this rank's shard of the dense parameters and of its experts
    optimizer = (dense / shard + eparams / eshard) * ADAM_TRAFFIC / f.memory_bw if op_opt is None else op_opt / shard
    if grad_acc is None:
        # free in the analytic model: at scale the accumulation into the fp32 gradient is fused into
        # the weight-gradient GEMM (Megatron-LM's gradient_accumulation_fusion). The op profile
        # counts the separate add torch's autograd runs (what timed emulation charges)
        grad_acc = 0.0
    return ReplicaCost(fwd=fwd, bwd=bwd, tp_comm=tp_comm, ep_comm=ep_comm, params_local=dense + eparams,
                       memory=memory, optimizer=optimizer, grad_acc=grad_acc, expert_params_local=eparams,
                       bwd_weight=min(max(0.0, compute_fwd - attn), bwd))


def _forward_seconds(m: ModelFacts, f: ChipFacts, tp: int, n_layers: int, last: bool, mb: int,
                     experts_local: Optional[int], group_mb: Optional[int]) -> tuple[float, float, float]:
    """(compute, memory-bound elementwise, attention core) seconds of one forward on one TP rank: each
    GEMM at the chip matrix's fraction for its shape, the attention core at its attention fraction,
    any other counted FLOPs at the best rate; elementwise = 2 x activation bytes / memory bandwidth.

    apply_plan's TP (hal/strategies/tensor_parallel.py) shards the blocks only: the embedding,
    final norm, head and loss run replicated on every rank of the TP group. It leaves the MoE layer
    unsharded (block_plan: it runs on the full activation, replicated over TP): every TP rank
    all-gathers the sequence, routes it and runs its replica's experts on all the routed tokens, so
    the router and expert FLOPs are not divided by tp either."""
    block, attn = _block_seconds(m, f, tp, mb)
    secs = n_layers * block
    if m.experts:
        e_local = experts_local if experts_local is not None else m.experts
        gmb = group_mb if group_mb is not None else mb
        tokens = m.seq * mb
        per_expert = m.seq * gmb * m.top_k / m.experts        # a balanced router's tokens per expert
        # each expert's GEMMs at the matrix's fraction for their own small M (the rows routed to it):
        # w1 and w3 are (M, ffn, h), w2 is (M, h, ffn); the router one (tokens, E, h) GEMM
        gemm = per_expert * m.hidden * m.ffn
        secs += n_layers * (2 * tokens * m.hidden * m.experts / _rate(f, tokens, m.experts, m.hidden)
                            + e_local * 2 * gemm * (2 / _rate(f, per_expert, m.ffn, m.hidden)
                                                    + 1 / _rate(f, per_expert, m.hidden, m.ffn)))
    if last:
        tokens, vt = m.seq * mb, (tp if m.vocab_parallel else 1)
        secs += m.head_fwd_flops() * mb / vt / _rate(f, tokens, m.vocab / vt, m.hidden)
    # the layer's activations without a score tensor ("selective" keeps none), written and read once
    act = ELEMENTWISE_PASSES * (m.act_bytes(tp, "selective") - m.dispatched_act_bytes()) * mb * n_layers
    if not m.fused_attention:      # the score tensor's traffic (its heads are split over TP)
        act += SCORE_BYTES * m.heads / tp * m.seq ** 2 * mb * n_layers
    return secs, act / f.memory_bw, n_layers * attn


def _megatron_p2p_seconds(m: ModelFacts, f: ChipFacts, tp: int, mb: int, tp_bw: float) -> tuple[float, float]:
    """(a send's seconds on the sender's stream, the receiver's gather) per micro-batch under Megatron-LM's
    synchronous p2p: each TP rank sends 1/t of the boundary activation (scatter/gather, or its sequence-
    parallel shard) to the next stage on another node (TP fills a node in the published runs that use
    it: the rank's NIC); without sequence parallelism the receiver all-gathers the t pieces over TP."""
    nbytes = m.boundary_bytes() * mb / tp
    gathered = 0.0 if m.sequence_parallel or tp <= 1 else gather_time(nbytes * tp, tp, tp_bw, f.link_latency)
    return p2p_time(nbytes, f, f, same_node=False), gathered


def loss_bytes(m: ModelFacts, tp: int, mb: int) -> float:
    """Memory traffic of the loss on the last stage for a micro-batch of `mb` samples, forward and backward
    together: its LOSS_COPIES fp32 s x vocab tensors (logits, log-softmax, and in backward their gradients;
    the same tensors _memory_bytes counts) each written once and read once (ELEMENTWISE_PASSES), half in
    each pass; the vocabulary split over TP where the runtime shards it (vocab_parallel). A lower bound on
    what torch's cross_entropy and Megatron-LM's vocab-parallel loss move (both also cast the 16-bit
    logits to fp32 and re-read them for the max and the sum); priced at ChipFacts.memory_bw."""
    vt = tp if m.vocab_parallel else 1
    return ELEMENTWISE_PASSES * LOSS_COPIES * FP32 * m.seq * m.vocab * mb / vt


def moe_dispatch_bytes(m: ModelFacts, mb: int, experts_local: Optional[int],
                       ep: Optional[tuple[int, float]]) -> float:
    """Memory traffic of one MoE layer's forward beyond its GEMMs, for a micro-batch of `mb` samples
    (T = s x mb tokens, k = top_k, E experts, B bytes per activation element); 0 for a dense model.
    Each pass is memory-bound (priced at ChipFacts.memory_bw by the caller); its backward moves the
    same bytes (the gradient of a gather is a scatter-add over the same rows and vice versa), so the
    caller charges it once forward and once backward. Both runtimes have these passes: Megatron-Core's
    alltoall token dispatcher (permute / sort_chunks_by_idxs / unpermute) and hal.strategies.moe
    (index gather, argsort by destination, index_add back).
      - router: softmax reads the T x E logits (B) and writes fp32 scores, top-k reads them and
        writes k fp32 probabilities and int64 indices per token: T E (B + 2 x 4) + T k (4 + 8);
      - permute: every routed row is read from its token and written to its expert's place: 2 k T h B;
      - unpermute: the k routed outputs of a token read, scaled by their probabilities and summed
        into one row: (k + 1) T h B;
      - with EP and more than one local expert, the received rows are sorted from (source rank,
        expert) into expert order before the experts and back after: 2 x 2 k T h B."""
    if not m.experts:
        return 0.0
    tokens, k, row = m.seq * mb, m.top_k, m.hidden * m.dtype_bytes
    router = tokens * m.experts * (m.dtype_bytes + 2 * ROUTER_BYTES) + tokens * k * (ROUTER_BYTES + INDEX_BYTES)
    moved = 2 * k * tokens * row + (k + 1) * tokens * row
    e_local = experts_local if experts_local is not None else m.experts
    if ep is not None and ep[0] > 1 and e_local > 1:
        moved += 4 * k * tokens * row
    return router + moved


def attention_work_share(cfg) -> float:
    """The work a fused (flash-style) attention kernel does, mean over the layers, as a share of the model
    FLOPs' full 4 s^2 d count (hal.core.chip_matrix.fused_attention_share, the one definition): a causal
    layer computes s(s + 1)/2 of the s^2 score elements, as FlashAttention's benchmarks count a causal run
    (the count the matrix's `attention` fraction is rated on), and a sliding-window layer W(W + 1)/2 +
    (s - W) W of them (the count cuDNN's SDPA benchmark rates its sliding-window kernel on; its H200 run with
    cuDNN 9.19.1 takes time linear in s at W = 1024: cudnn-frontend benchmark/sdpa_benchmark_training/
    results/h200_919_only_cudnn/gpt_oss_20260227_034819.csv at df73764adb). Every model here is a causal
    decoder. The layers of a pipeline stage are priced at this mean; an unfused core does the full count."""
    windowed = cfg.windowed_layers() if hasattr(cfg, "windowed_layers") else 0
    full = fused_attention_share(cfg.seq)
    if not windowed:
        return full
    share = fused_attention_share(cfg.seq, window=cfg.sliding_window)
    return (windowed * share + (cfg.layers - windowed) * full) / cfg.layers


def bound_flops_per_sample(facts: Sequence[ChipFacts], m: ModelFacts) -> float:
    """The model FLOPs of one sample's training step (no recompute) as the upper bound (b) prices them at every
    chip's best sustained rate (ChipFacts.flops): attention's counted FLOPs (3 x 4 s^2 q_dim per layer) shrunk
    to the cheapest any chip runs them at, min(1, share x best / attention rate) of the count. A fused causal
    core does about half its count at the matrix's `attention` fraction, which can beat the best GEMM
    fraction per counted FLOP (an H100: 0.50 / 0.5 > 0.80); an unfused core runs all of it at a GEMM fraction
    (at most the best). Taking the cheapest chip keeps it a bound for any split of the work over the chips."""
    total = m.step_flops_per_sample()
    if not m.fused_attention:
        return total
    attn = 3 * m.layers * 4 * m.seq * m.q_dim * m.seq
    ratios = [1.0]
    for f in facts:
        rate = f.peak * f.matrix.attention_rate if f.matrix is not None else f.flops
        ratios.append(m.attention_share * f.flops / rate)
    return total - attn * (1.0 - min(ratios))


def _rate(f: ChipFacts, mm: float, n: float, k: float) -> float:
    """FLOP/s of an (m, n, k) GEMM on chip `f`: its matrix's fraction x peak (no matrix: the best rate)."""
    return f.peak * f.matrix.gemm_fraction(mm, n, k) if f.matrix is not None else f.flops


_BLOCK: dict = {}


def _block_seconds(m: ModelFacts, f: ChipFacts, tp: int, mb: int) -> tuple[float, float]:
    """(seconds, of which the attention core) of one block's forward without its experts and router,
    for a micro-batch of `mb` samples on one of `tp` TP ranks (memoised)."""
    key = (id(m), id(f), tp, mb)
    hit = _BLOCK.get(key)
    if hit is not None:
        return hit[2]
    tokens = m.seq * mb
    shapes = gemm_shapes(tokens, m.hidden, m.ffn, m.q_dim, m.kv_dim, tp)
    if m.experts:
        shapes = shapes[:2]                      # the attention projections; the MoE layer is priced apart
        total = (m.layer_fwd_flops() - m.seq * 2 * m.expert_params * m.top_k - m.seq * 2 * m.hidden * m.experts)
    else:
        total = m.layer_fwd_flops()
    total = total * mb / tp
    gemm_fl = sum(2 * a * b * c for a, b, c in shapes)
    attn_fl = 4 * m.seq * m.q_dim * tokens / tp
    attn_rate = f.peak * f.matrix.attention_rate if f.matrix is not None else f.flops
    if not m.fused_attention:      # QK^T (s, s, d) and AV (s, d, s) per head: the same GEMM fraction
        attn_rate = _rate(f, m.seq, m.seq, m.q_dim / m.heads)
    attn = attn_fl * m.attention_share / attn_rate
    secs = sum(2 * a * b * c / _rate(f, a, b, c) for a, b, c in shapes) + attn + \
        max(0.0, total - gemm_fl - attn_fl) / f.flops
    if len(_BLOCK) > 100_000:
        _BLOCK.clear()
    _BLOCK[key] = (m, f, (secs, attn))
    return secs, attn


def _comm_seconds(m: ModelFacts, f: ChipFacts, tp: int, n_layers: int, mb: int, tp_bw: float,
                  ep: Optional[tuple[int, float]]) -> tuple[float, float]:
    """(TP, EP) communication seconds of one forward + backward, not overlapped with compute.

    TP: 4 all-reduce-equivalents of b s h per layer (sequence parallel: an all-gather and a
    reduce-scatter around attention and around the MLP, forward and backward); the unsharded MoE
    layer has only its input all-gather forward and its output gradient's all-gather backward
    (block_plan's PrepareModuleInputOutput: the output is a local chunk): 3 of 4.
    EP: dispatch + combine forward and the same backward, 4 all_to_all of tokens x top_k x h. Every
    rank of the TP group moves all its replica's tokens on its own link (`ep[1]`, per rank): the EP
    group is the replicas' ranks of one TP index (apply._apply_ep), each holding the full
    all-gathered sequence, so nothing here is divided by tp."""
    tp_comm = 0.0
    if tp > 1:
        tp_comm = n_layers * 4 * allreduce_time(m.dtype_bytes * m.seq * m.hidden * mb, tp, tp_bw, f.link_latency)
    if m.experts and tp > 1:
        tp_comm *= 3 / 4
    ep_comm = 0.0
    if m.experts and ep is not None and ep[0] > 1:
        e, bw = ep
        tokens = m.seq * mb
        ep_comm = n_layers * 4 * (e - 1) / e * tokens * m.top_k * m.hidden * m.dtype_bytes / bw
    return tp_comm, ep_comm


def _local_params(m: ModelFacts, tp: int, n_layers: int, first: bool, last: bool,
                  experts_local: Optional[int]) -> tuple[float, float, float]:
    """(dense parameters per rank, expert parameters per rank, a layer's TP-sharded parameters).

    The MoE layer is replicated over TP (router and this replica's experts in full on every TP
    rank); the attention and norms are TP-sharded; the embedding and head are whole on the first
    and last stage's ranks."""
    layer_p, eparams = m.layer_params, 0.0
    if m.experts:
        router_p = m.hidden * m.experts
        layer_p = layer_p - m.expert_params * m.experts - router_p     # attention and norms: TP-sharded
        eparams = n_layers * m.expert_params * (experts_local if experts_local is not None else m.experts)
        dense = n_layers * (layer_p / tp + router_p)
    else:
        dense = n_layers * layer_p / tp
    ends = (m.embed_params if first else 0) + (m.embed_params if last else 0)
    dense += ends / tp if m.vocab_parallel else ends
    return dense, eparams, layer_p


def _memory_bytes(m: ModelFacts, tp: int, n_layers: int, last: bool, mb: int, recompute, zero: int, dp: int,
                  in_flight: int, dense: float, eparams: float, layer_p: float, eshard: int = 1) -> float:
    """Peak bytes per rank: parameter state, DDP's buckets, activations kept, backward's working set
    or the loss (whichever is larger), ZeRO-3's gathered layers, the bridge's staging.

    Experts are left out of DDP and FSDP2 (apply._apply_dp: ddp_ignore_experts,
    fully_shard(..., ignored_params=expert_params(block))): whatever the ZeRO level each rank keeps
    their weights, gradients and AdamW state whole (16 B/parameter), and their gradients are
    reduced only across expert-DP copies (expert_parallel.reduce_expert_grads). `eshard` > 1: a runtime
    that shards expert state over its `eshard` expert-DP copies at this ZeRO level
    (ModelFacts.shard_expert_state, Megatron-Core's distributed optimizer)."""
    per_param = m.cfg.state_bytes_per_param     # ModelConfig's table: the one definition of ZeRO's bytes
    state = dense * per_param(zero, dp) + eparams * (per_param(zero, eshard) if eshard > 1 else 16.0)
    act_keep = m.act_bytes(tp, recompute) * mb * n_layers * in_flight
    # backward's working set: the gradients of one layer's activations for one micro-batch (about
    # the size of what the layer saved); under full recompute that layer's activations come back too
    act_work = m.act_bytes(tp, False) * mb * (2 if recompute_kind(recompute) == "full" else 1)
    # the loss on the last stage: fp32 logits, their log-softmax, and in backward the gradients of
    # both (torch's cross_entropy; tests/test_planner_memory.py checks it against emulated runs). It
    # and the layer working set are not live at once (the loss's backward runs before the layers'),
    # so the larger of the two counts.
    loss = LOSS_COPIES * FP32 * m.seq * m.vocab * mb / (tp if m.vocab_parallel else 1) if last else 0.0
    zero3_gather = (m.dtype_bytes * layer_p / tp * 2) if zero == 3 else 0.0       # two layers gathered ahead
    # torch DDP (zero 0, dp > 1; apply_plan's data parallel) keeps its gradient buckets apart from
    # .grad (gradient_as_bucket_view is off): one more fp32 gradient per parameter it reduces
    buckets = dense * GRAD_BYTES if zero == 0 and dp > 1 else 0.0
    return state + buckets + act_keep + max(act_work, loss) + zero3_gather + BRIDGE_STAGING
