"""A mixture-of-experts FFN layer (top-k router, per-expert capacity, Switch/GShard load-balancing
loss, SwiGLU experts through `hal.ops`) that runs in one process or expert-parallel over any process
group (`hetero` included), with tokens moved by `all_to_all_single` with uneven splits.

Semantics (one definition, the same code path in one process and on W ranks; the parity tests hold it):
- Routing: probs = softmax(x @ router.T) in float32 per token; the top_k experts of each token are its
  assignments (slot j = its j-th choice); gates are the top-k probs, renormalised to sum 1 when
  top_k > 1 and norm_topk_prob (GShard/Mixtral/Qwen3-MoE), the raw probs otherwise (Switch at
  top_k == 1; Qwen2-MoE with norm_topk_prob false).
- Shared experts (DeepSeek-MoE, Qwen2-MoE): `shared_ffn` > 0 adds one SwiGLU path of that width
  (`self.shared`; n shared experts of width f are one path of width n f) that every token meets,
  added to the routed output, times sigmoid(x @ shared_gate.T) when `shared_gate` (Qwen2-MoE; the
  sigmoid is torch's, hal.ops has no sigmoid). It is an ordinary dense weight: replicated on every
  EP rank, not an expert (expert_parallel leaves it to DP like the router).
- Capacity is per expert over the tokens of ONE forward of the whole EP group (the global
  micro-batch): C = ceil(capacity_factor * T_global * top_k / experts), T_global = tokens summed over
  the EP group's ranks. An expert keeps its assignments in the order (slot, global token index) and
  drops those past C (first choices before second choices, as GShard). The global token index is
  (EP rank, local index): ranks hold contiguous row ranges of the global batch in EP-rank order (as a
  Plan's replicas do), so the order, hence what is dropped, is exactly the single-process order of the
  same global batch, whatever the split. capacity_factor <= 0 (or None) disables dropping. A dropped
  assignment contributes 0 (the token keeps its residual path), as in Switch.
- Every rank learns every rank's per-(expert, slot) counts with one small all_gather, so a sender
  decides drops itself (dropped tokens never travel) and both sides know the all_to_all splits.
- Expert data parallel (EP groups inside a DP group, `stats_group`): the DP group is cut into EP groups
  of W consecutive ranks, each hosting every expert once. Tokens travel only inside their EP group,
  but the counts are all_gathered over the whole `stats_group` (the DP group), so capacity, the drop
  order (slot, DP rank, local token) and the aux loss's f_e are those of the whole global micro-batch:
  the same tokens drop as in one process. Each expert copy then sees only its EP group's tokens, and
  the copies' gradients SUM to the single-process gradient once reduced over the expert-DP group
  (hal.strategies.expert_parallel.reduce_expert_grads).
- Load-balancing loss (Switch eq. 4, top-k counted): aux = E * sum_e f_e * P_e with
  f_e = (assignments routed to e before dropping) / (T_global * top_k) and P_e = mean router prob of e
  over the T_global tokens. Each rank stores in `.aux_loss` its share E * sum_e f_e * (sum of its
  tokens' probs of e) / T_global: the sum over EP ranks is the single-process aux loss, so with the
  training contract's loss convention (each rank's loss already divided by global counts, gradients
  SUM-reduced) one step equals the single-process step. `.aux_loss` is coefficient-free: the model
  multiplies it by ModelConfig.moe_aux_loss_coef. Under pipeline parallelism a stage cannot add it to
  the loss (only the last stage has one): set `inject_aux_coef` (expert_parallel.inject_aux_loss) and
  the layer puts coef x its share into backward itself, Megatron-LM's MoEAuxLossAutoScaler.
- Experts live in `self.experts`, an nn.ModuleDict keyed by GLOBAL expert id ("0", "5", ...), so a
  rank hosting experts [5, 1] holds parameters named `experts.5.w1.weight`, ... exactly as the
  single-process model names them (parity, checkpoints). An uneven placement (a faster chip hosting
  more experts) is an explicit list of expert ids per EP rank; DTensor Shard(0) cannot express that,
  which is why experts are not one stacked tensor.
Collectives are bounded by the process group's own timeout (every torch.distributed call is).
"""
from __future__ import annotations

import math
import warnings
from typing import Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.nn.functional import all_to_all_single

import hal.ops as ops
from hal.contract.errors import HalError


class MoEError(HalError, ValueError):
    """A MoE layer or expert placement that cannot work; the message names the field and the numbers."""


def check_placement(placement: Sequence[Sequence[int]], experts: int, group_size: int) -> list[list[int]]:
    """Validate an expert placement (expert ids per EP rank): one entry per rank, every expert once."""
    placement = [list(map(int, p)) for p in placement]
    if len(placement) != group_size:
        raise MoEError(f"expert placement has {len(placement)} entries for an EP group of {group_size} "
                       f"ranks: {placement}")
    seen: dict[int, int] = {}
    for rank, ids in enumerate(placement):
        for e in ids:
            if not 0 <= e < experts:
                raise MoEError(f"expert placement: EP rank {rank} hosts expert {e}, outside 0..{experts - 1}")
            if e in seen:
                raise MoEError(f"expert placement: expert {e} is placed on EP ranks {seen[e]} and {rank}; "
                               f"every expert lives exactly once")
            seen[e] = rank
    missing = sorted(set(range(experts)) - set(seen))
    if missing:
        raise MoEError(f"expert placement: experts {missing} of {experts} are hosted by no EP rank: {placement}")
    return placement


def even_placement(experts: int, ep_size: int) -> list[list[int]]:
    """Contiguous blocks of expert ids, the first ranks one more when uneven (what a homogeneous tool picks)."""
    base, extra = divmod(experts, ep_size)
    out, start = [], 0
    for r in range(ep_size):
        n = base + (1 if r < extra else 0)
        out.append(list(range(start, start + n)))
        start += n
    return out


class Expert(nn.Module):
    """One SwiGLU FFN: w2(silu(x w1^T) * (x w3^T)), through hal.ops (one matmul for gate and up)."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn, bias=False)   # gate
        self.w3 = nn.Linear(hidden, ffn, bias=False)   # up
        self.w2 = nn.Linear(ffn, hidden, bias=False)   # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = ops.linear(x, torch.cat([self.w1.weight, self.w3.weight]))  # (n, 2 ffn)
        return ops.linear(ops.swiglu(gate_up), self.w2.weight)                # (n, hidden)


def _all_to_all(x: torch.Tensor, out_rows: int, send_splits: list[int], recv_splits: list[int],
                group) -> torch.Tensor:
    """Differentiable uneven all_to_all_single of rows (torch.distributed.nn.functional's; its
    backward is the reverse all_to_all)."""
    out = x.new_empty((out_rows,) + tuple(x.shape[1:]))
    with warnings.catch_warnings():  # torch 2.13 marks it deprecated for compile; eager use is fine
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", UserWarning)
        return all_to_all_single(out, x.contiguous(), recv_splits, send_splits, group=group)


class _InjectAux(torch.autograd.Function):
    """Identity on the layer output whose backward also gives `aux` the gradient 1 (Megatron-LM's
    MoEAuxLossAutoScaler, megatron/core/transformer/moe/moe_utils.py): the aux loss trains the router
    without being added to the loss, which a pipeline stage other than the last cannot do."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(aux)
        return y

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        (aux,) = ctx.saved_tensors
        return grad_y, torch.ones_like(aux)


def _priority(per_rank: torch.Tensor, cap: Optional[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(col[e, j]: assignments of slot j to expert e over all ranks, base[s, e, j]: global priority
    position of rank s's first (e, slot j) assignment, kept[s, e, j]: how many of them fit the
    capacity). Priority order is (slot, rank, local token): earlier slots of every rank, then
    earlier ranks, as one process holding every token would drop."""
    col = per_rank.sum(0)                                                # (E, k)
    slot_before = torch.cumsum(col, 1) - col                             # (E, k)
    rank_before = torch.cumsum(per_rank, 0) - per_rank                   # (S, E, k)
    base = slot_before.unsqueeze(0) + rank_before                        # (S, E, k)
    if cap is None:
        kept = per_rank
    else:
        kept = (cap - base).clamp(min=0).minimum(per_rank)               # (S, E, k)
    return col, base, kept


class MoE(nn.Module):
    """Mixture-of-experts FFN: x (..., hidden) -> (..., hidden); `.aux_loss` set by every forward.

    `group` None (or a 1-rank group) runs in one process; otherwise the layer is expert-parallel over
    `group` with `placement[r]` the expert ids EP rank r hosts (default: contiguous even blocks) and
    only this rank's experts kept (see hal.strategies.expert_parallel.apply_ep to convert a full model).
    """

    def __init__(self, hidden: int, ffn: int, experts: int, top_k: int = 2, capacity_factor: Optional[float] = 1.25,
                 group: Optional[dist.ProcessGroup] = None, placement: Optional[Sequence[Sequence[int]]] = None,
                 local_experts: Optional[Sequence[int]] = None,
                 stats_group: Optional[dist.ProcessGroup] = None, norm_topk_prob: bool = True,
                 shared_ffn: int = 0, shared_gate: bool = False) -> None:
        super().__init__()
        for name, v in (("hidden", hidden), ("ffn", ffn), ("experts", experts), ("top_k", top_k)):
            if v < 1:
                raise MoEError(f"MoE: {name}={v} must be >= 1")
        if top_k > experts:
            raise MoEError(f"MoE: top_k={top_k} exceeds experts={experts}")
        self.hidden, self.ffn, self.num_experts, self.top_k = hidden, ffn, experts, top_k
        if shared_gate and not shared_ffn:
            raise MoEError(f"MoE: shared_gate=True needs a shared path (shared_ffn={shared_ffn})")
        self.capacity_factor, self.norm_topk_prob = capacity_factor, norm_topk_prob
        self.router = nn.Linear(hidden, experts, bias=False)
        ids = range(experts) if local_experts is None else local_experts
        self.experts = nn.ModuleDict({str(int(e)): Expert(hidden, ffn) for e in ids})
        if shared_ffn:
            self.shared = Expert(hidden, shared_ffn)     # dense, replicated (not expert-parallel)
            if shared_gate:
                self.shared_gate = nn.Linear(hidden, 1, bias=False)
        self.aux_loss: Optional[torch.Tensor] = None
        # None: the model adds coef x aux_loss to its loss (GPT.aux_loss()). A float c: the layer injects
        # c x its aux share into backward itself (_InjectAux) - for pipeline stages; then do NOT also
        # add the aux loss to the loss (it would count twice).
        self.inject_aux_coef: Optional[float] = None
        self.last_stats: dict = {}
        self.set_group(group, placement, stats_group)

    # ---- placement ----------------------------------------------------------------------------
    def set_group(self, group: Optional[dist.ProcessGroup], placement: Optional[Sequence[Sequence[int]]] = None,
                  stats_group: Optional[dist.ProcessGroup] = None) -> None:
        """Bind the EP group and placement; keep only this rank's experts (the others are dropped).
        `stats_group` (expert data parallel): the DP group this EP group is one block of; routing
        counts, capacity and the aux loss's statistics are taken over it (module docstring)."""
        size = 1 if group is None else dist.get_world_size(group)
        me = 0 if group is None else dist.get_rank(group)
        self.stats_group, self.stats_size, self.stats_rank, self.ep_offset = None, size, me, 0
        if stats_group is not None and dist.get_world_size(stats_group) > size:
            ssize, srank = dist.get_world_size(stats_group), dist.get_rank(stats_group)
            # EP groups are blocks of `size` consecutive members of the stats (DP) group
            if ssize % size or srank % size != me:
                raise MoEError(f"MoE: EP group of {size} ranks (this rank {me}) is not a block of consecutive "
                               f"members of the stats group of {ssize} (this rank {srank}): {ssize} % {size} = "
                               f"{ssize % size}, {srank} % {size} = {srank % size}")
            self.stats_group, self.stats_size, self.stats_rank = stats_group, ssize, srank
            self.ep_offset = srank - me
        if placement is None:
            placement = even_placement(self.num_experts, size)
        self.placement = check_placement(placement, self.num_experts, size)
        self.group = group
        self.ep_rank, self.ep_size = me, size
        mine = self.placement[me]
        missing = [e for e in mine if str(e) not in self.experts]
        if missing:
            raise MoEError(f"MoE on EP rank {me}: placement gives it experts {mine} but the layer holds "
                           f"{sorted(int(k) for k in self.experts)}; experts {missing} are missing "
                           f"(build the full layer, then apply_ep)")
        for key in [k for k in self.experts if int(k) not in mine]:
            del self.experts[key]
        self.host_of = torch.empty(self.num_experts, dtype=torch.long)
        self.slot_of = torch.empty(self.num_experts, dtype=torch.long)  # position among its host's experts
        for r, ids in enumerate(self.placement):
            for i, e in enumerate(ids):
                self.host_of[e], self.slot_of[e] = r, i

    def capacity(self, tokens_global: int) -> Optional[int]:
        """Per-expert capacity for a forward over `tokens_global` tokens of the EP group (None: no dropping)."""
        if self.capacity_factor is None or self.capacity_factor <= 0:
            return None
        return math.ceil(self.capacity_factor * tokens_global * self.top_k / self.num_experts)

    # ---- forward ------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Route every token to its top-k experts, keep each expert's first `capacity` assignments in
        the global priority order, send the kept rows to their experts' hosts, run the experts,
        send the outputs back and sum them weighted by the gates (module docstring)."""
        shape = x.shape
        if shape[-1] != self.hidden:
            raise MoEError(f"MoE: input {tuple(shape)} has last dim {shape[-1]}, expected hidden={self.hidden}")
        xt = x.reshape(-1, self.hidden)                                      # (T, h)
        T, E, k, W = xt.size(0), self.num_experts, self.top_k, self.ep_size
        probs = ops.softmax(ops.linear(xt, self.router.weight).float(), dim=-1)   # (T, E) float32
        top_p, top_e = probs.topk(k, dim=-1)                                 # (T, k)
        gates = top_p / top_p.sum(-1, keepdim=True) if k > 1 and self.norm_topk_prob else top_p
        dev = xt.device
        top_e = top_e.detach().cpu()  # routing bookkeeping is small integer work: on the host

        per_rank, t_global = self._global_counts(top_e, T, dev)
        cap = self.capacity(t_global)
        col, base, kept = _priority(per_rank, cap)
        tok, slot, exp = self._kept_assignments(top_e, T, base, cap)
        tok, slot = tok.to(dev), slot.to(dev)
        send_splits, recv_per = self._splits(kept)
        recv_splits = [int(v) for v in recv_per.sum(1)]

        payload = xt[tok]                                                    # (sent, h)
        if W > 1:
            received = _all_to_all(payload, sum(recv_splits), send_splits, recv_splits, self.group)
        else:
            received = payload
        outs = self._run_experts(received, recv_per, dev)
        back = _all_to_all(outs, payload.size(0), recv_splits, send_splits, self.group) if W > 1 else outs
        y = torch.zeros_like(xt).index_add(0, tok, back * gates[tok, slot].unsqueeze(1).to(back.dtype))
        if hasattr(self, "shared"):
            y = y + self._shared(xt)

        # load-balancing share of this rank (see module docstring)
        if t_global:
            f = col.sum(1).to(device=dev, dtype=probs.dtype) / (t_global * k)  # (E,)
            self.aux_loss = E * (f * probs.sum(0)).sum() / t_global
        else:
            self.aux_loss = probs.sum() * 0.0
        self.last_stats = {"tokens_global": t_global, "capacity": cap,
                           "dropped_global": int((per_rank - kept).sum()), "sent": int(payload.size(0)),
                           "received": int(received.size(0))}
        y = y.reshape(shape)
        if self.inject_aux_coef is not None and torch.is_grad_enabled():
            y = _InjectAux.apply(y, self.aux_loss * self.inject_aux_coef)
        return y

    def _shared(self, xt: torch.Tensor) -> torch.Tensor:
        """The shared experts' output for tokens xt (T, h), gated per token when shared_gate."""
        out = self.shared(xt)
        if hasattr(self, "shared_gate"):
            out = torch.sigmoid(ops.linear(xt, self.shared_gate.weight)) * out
        return out

    def _global_counts(self, top_e: torch.Tensor, T: int, dev: torch.device) -> tuple[torch.Tensor, int]:
        """(per_rank[s, e, j]: rank s's assignments of slot j to expert e, tokens over all ranks),
        over the statistics group (the DP group under expert data parallel, else the EP group), so
        capacity and the drop order are those of one process holding every token."""
        E, k = self.num_experts, self.top_k
        # counts[e, j] = local assignments of slot j to expert e; last row: [T, 0, ...]
        counts = torch.zeros(E + 1, k, dtype=torch.long)
        counts[:E].scatter_add_(0, top_e, torch.ones_like(top_e))
        counts[E, 0] = T
        S = self.stats_size
        sgroup = self.stats_group if self.stats_group is not None else self.group
        if S > 1:
            gathered = [torch.empty_like(counts, device=dev) for _ in range(S)]
            dist.all_gather(gathered, counts.to(dev), group=sgroup)
            every = torch.stack(gathered).cpu()                              # (S, E + 1, k)
        else:
            every = counts.unsqueeze(0)
        return every[:, :E], int(every[:, E, 0].sum())                      # (S, E, k), tokens

    def _kept_assignments(self, top_e: torch.Tensor, T: int, base: torch.Tensor,
                          cap: Optional[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This rank's kept assignments in send order (host rank, position at host, slot, token):
        (token, slot, expert) per row. An assignment is kept when its global priority position
        (base of its (expert, slot) on this rank + its index among them) is below the capacity."""
        E, k = self.num_experts, self.top_k
        tok = torch.arange(T).unsqueeze(1).expand(T, k).reshape(-1)          # (T k,)
        slot = torch.arange(k).unsqueeze(0).expand(T, k).reshape(-1)
        exp = top_e.reshape(-1)
        order = torch.argsort(((self.host_of[exp] * E + self.slot_of[exp]) * k + slot) * max(T, 1) + tok)
        tok, slot, exp = tok[order], slot[order], exp[order]
        # index of each assignment within its run of equal (expert, slot): the sort keeps each run
        # contiguous and in token order, so that index is its rank among this rank's (e, j) assignments
        key = exp * k + slot
        new_run = torch.ones_like(key, dtype=torch.bool)
        new_run[1:] = key[1:] != key[:-1]
        run_start = torch.nonzero(new_run).squeeze(1)[torch.cumsum(new_run.long(), 0) - 1]
        within = torch.arange(key.numel()) - run_start
        pos = base[self.stats_rank, exp, slot] + within
        keep = pos < cap if cap is not None else torch.ones_like(pos, dtype=torch.bool)
        return tok[keep], slot[keep], exp[keep]

    def _splits(self, kept: torch.Tensor) -> tuple[list[int], torch.Tensor]:
        """(rows this rank sends each EP rank, recv_per[s, i]: rows EP rank s sends this rank's
        i-th expert). EP rank r is statistics rank ep_offset + r."""
        W, me, off = self.ep_size, self.ep_rank, self.ep_offset
        sent_per_expert = kept[self.stats_rank].sum(1)                       # (E,)
        send_splits = [int(sent_per_expert[self.placement[r]].sum()) if self.placement[r] else 0 for r in range(W)]
        mine = self.placement[me]
        ep_kept = kept[off:off + W]                                          # (W, E, k): this EP group's ranks
        recv_per = ep_kept[:, mine].sum(2) if mine else torch.zeros(W, 0, dtype=torch.long)  # (W, n_local)
        return send_splits, recv_per

    def _run_experts(self, received: torch.Tensor, recv_per: torch.Tensor, dev: torch.device) -> torch.Tensor:
        """This rank's experts on the rows it received: for each source rank, for each of its experts
        in placement order, recv_per[s, i] rows. `received * 0`, not empty_like: the reverse
        all_to_all must be in every rank's autograd graph, also on a rank hosting no expert (else
        its backward skips a collective the others run)."""
        outs = received * 0
        mine = self.placement[self.ep_rank]
        # local expert index of every received row: blocks (source s, expert i) of recv_per[s, i] rows
        row_expert = torch.repeat_interleave(torch.arange(len(mine)).repeat(self.ep_size), recv_per.reshape(-1))
        for i, e in enumerate(mine):
            rows = torch.nonzero(row_expert == i).squeeze(1)
            if rows.numel():
                rows = rows.to(dev)
                outs = outs.index_copy(0, rows, self.experts[str(e)](received[rows]))
        return outs
