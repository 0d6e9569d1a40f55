"""The plan search's closed form: a candidate layout without ranks (`Shape`: per stage, groups of
identical replicas) and its score (`estimate`), plus the integer splits the candidate generators
use (layers by speed, rows by water-filling, experts by weight) and the MoE EP options.

The score is the 1F1B step (m - 1) x the slowest stage + one pass through all stages + sends +
exposed DP reduction + optimizer (interleaved and ZBVZeroBubble: `estimate`). It works on counts per
(chip, rows, experts), never on ranks, so it costs the number of divisors, not the number of ranks;
finalists get ranks later (plan_search.materialize) and are simulated.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from ..schedule import Schedule
from .cost import GRAD_BYTES, ModelFacts, dp_reduce_time, group_bw, p2p_time, replica_cost
from .facts import ChipFacts
from .layout import SEND_AFTER_REDUCTION, in_flight, outputs_alive, stage_ends
from .sim_chain import chunk_layers

ZERO_LEVELS = (0, 2, 3)


def divisors(n: int) -> list[int]:
    """Every divisor of n, ascending."""
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def split_layers(L: int, per_layer: Sequence[float], extra: Sequence[float]) -> Optional[list[int]]:
    """Layers per stage (each >= 1, summing to L) minimising max(extra + layers x per_layer)."""
    p = len(per_layer)
    if L < p:
        return None
    lo, hi = 0.0, max(e + L * t for e, t in zip(extra, per_layer))
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(max(1, int((mid - e) / t)) if mid > e else 1 for e, t in zip(extra, per_layer)) >= L:
            hi = mid
        else:
            lo = mid
    n = [max(1, int((hi - e) / t)) if hi > e else 1 for e, t in zip(extra, per_layer)]
    while sum(n) > L:
        i = max((i for i in range(p) if n[i] > 1), key=lambda i: extra[i] + n[i] * per_layer[i])
        n[i] -= 1
    while sum(n) < L:
        i = min(range(p), key=lambda i: extra[i] + (n[i] + 1) * per_layer[i])
        n[i] += 1
    return n


def place_experts(E: int, weights: Sequence[float]) -> Optional[list[int]]:
    """Experts per replica (each >= 1, summing to E) in proportion to `weights` (largest remainder)."""
    n = len(weights)
    if E < n:
        return None
    tot = sum(weights)
    raw = [max(1.0, E * w / tot) for w in weights]
    out = [int(x) for x in raw]
    while sum(out) > E:
        i = max(range(n), key=lambda i: out[i] - raw[i] if out[i] > 1 else -1e9)
        out[i] -= 1
    while sum(out) < E:
        i = max(range(n), key=lambda i: raw[i] - out[i])
        out[i] += 1
    return out


@dataclass(frozen=True)
class Group:
    """`count` identical replicas of one stage: chip figures, TP degree, rows, experts hosted."""

    facts: ChipFacts
    tp: int
    mb: int
    experts: Optional[int]
    count: int


@dataclass
class Shape:
    """A layout without ranks: what the closed-form score needs (ranks are laid out for finalists)."""

    stages: list[tuple[tuple[int, int], list[Group]]]
    m: int
    zero: int
    recompute: list = field(default_factory=list)   # per stage, set by estimate: False, "selective" or True
    ep: Optional[int] = None   # MoE: EP degree (replicas per EP group, every stage); None: the whole DP group
    virtual: int = 1           # stages per rank group (>1: torch's Interleaved1F1B, Narayanan et al. 2021)
    schedule: str = Schedule.ONE_F_ONE_B    # ZBVZeroBubble: virtual 2 in a V (Qi et al. 2023)

    def microbatch(self, s: int) -> int:
        return sum(g.mb * g.count for g in self.stages[s][1])


RECOMPUTE_TRIES = (False, "selective", True)     # a stage's recompute, cheapest first


def recompute_text(flags: Sequence) -> str:
    """'recompute in k/p stages' (k: stages that recompute, selective ones counted apart)."""
    sel = sum(1 for r in flags if r == "selective")
    full = sum(1 for r in flags if r is True)
    return f"recompute in {full + sel}/{len(flags)} stages" + (f" ({sel} selective)" if sel else "")


def estimate(shape: Shape, model: ModelFacts, uniform: bool = False) -> tuple[float, bool]:
    """Closed-form step time and whether every replica fits its memory. 1F1B: (m - 1) x the slowest
    stage + one pass through all stages; interleaved (v > 1): the pass less (1 - 1/v) of its fill
    (Narayanan et al. 2021, the bubble / v) and the sends x v; ZBVZeroBubble: `_zbv_pass`. Recompute is
    chosen per stage: a stage recomputes only when it does not fit without (`shape.recompute` lists it)."""
    p, m, v = len(shape.stages), shape.m, shape.virtual
    stage_t, fits, tail, p2p, chain = [], True, 0.0, 0.0, 0.0
    flags, split = [], []
    for s, ((a, b), groups) in enumerate(shape.stages):
        n_layers, dp, bm = b - a, sum(g.count for g in groups), shape.microbatch(s)
        alive = in_flight(m, p, s, v, shape.schedule, chunk_layers(n_layers, v))
        nic = min(g.facts.nic_bw for g in groups)
        # none, else selective (saves memory only where the attention core keeps its scores: an unfused
        # core, ModelFacts(fused_attention=False)), else full
        for recompute in ((shape.recompute[0],) if uniform else RECOMPUTE_TRIES):
            worst, opt, bwd_min, params, eparams, ok = 0.0, 0.0, float("inf"), 0.0, 0.0, True
            first, last = stage_ends(s, p, shape.schedule)
            fiw = (0.0, 0.0, 0.0)
            for g in groups:
                ep, gmb = ep_of(model, shape.ep, dp, g, nic, bm)
                c = replica_cost(model, g.facts, g.tp, n_layers, first, last, g.mb, recompute, shape.zero,
                                 dp, alive, ep=ep, experts_local=g.experts,
                                 group_mb=gmb, outputs_alive=outputs_alive(alive, v, last))
                ok = ok and c.memory <= g.facts.memory
                if c.fwd + c.bwd >= worst:
                    fiw = (c.fwd, c.bwd - c.bwd_weight, c.bwd_weight)
                worst = max(worst, c.fwd + c.bwd)
                opt, bwd_min = max(opt, c.optimizer), min(bwd_min, c.bwd)
                eparams = c.expert_params_local      # whole on each TP rank, outside DDP/FSDP2
                params = c.params_local - eparams
            if ok:
                break
        fits = fits and ok
        flags.append(recompute)
        stage_t.append(worst)
        split.append(fiw)
        if dp > 1:
            parts: dict[str, list] = {}
            for g in groups:
                parts.setdefault(g.facts.name, [g.facts, 0, g.tp])[1] += g.count
            # a part on one node (its TP groups are consecutive ranks) reduces over the intra link
            plist = [(f, n, group_bw(f, n * tp <= f.ranks_per_node)) for f, n, tp in parts.values()]
            t_red = dp_reduce_time(max(params, 0) * GRAD_BYTES, plist)
            t_red += expert_reduce_time(eparams, shape.ep, dp, [(f, n) for f, n, _ in parts.values()])
            exposed = max(0.0, t_red - bwd_min) + t_red / max(n_layers, 1)
            tail = max(tail, exposed + opt)
            if SEND_AFTER_REDUCTION and s > 0 and not (shape.zero == 0 and groups[0].tp > 1):
                # apply_plan's pipeline sends the last input gradients after the reduction that runs
                # inside backward (simulate.Layout.send_after_reduction): the exposed reduction of
                # every stage but the first lies on the backward chain through the stages
                chain += exposed
        else:
            tail = max(tail, opt)
        if s < p - 1:
            g0, g1 = groups[0], shape.stages[s + 1][1][0]
            p2p += 2 * p2p_time(g0.mb * model.boundary_bytes() / g0.tp, g0.facts, g1.facts, False)
    if not uniform:
        shape.recompute = flags
    mx = max(stage_t)
    if shape.schedule == Schedule.ZBV_ZERO_BUBBLE:
        return _zbv_pass(m, p, stage_t, split) + 2 * p2p + chain + tail, fits
    return (m - 1) * mx + mx + (sum(stage_t) - mx) / v + p2p * v + chain + tail, fits


def _zbv_pass(m: int, p: int, stage_t: Sequence[float], split: Sequence[tuple[float, float, float]]) -> float:
    """ZBVZeroBubble's compute span in closed form: m x the slowest rank group's F + I + W, plus a fill
    of (p - 1) x max(0, F + I - 2 W) / 2 of that group: ZB-H1's bubble (p - 1)(T_F + T_B - T_W) (Qi et
    al. 2023, section 2) with the V's chunks of half the layers and a W in each, zero when
    T_F = T_B = T_W as the paper's ZB-V is. A ranking only: finalists replay torch's order (sim_chain.py)."""
    s = max(range(p), key=lambda i: stage_t[i])
    f, i, w = split[s]
    return m * stage_t[s] + (p - 1) * max(0.0, f + i - 2 * w) / 2


def ep_of(model: ModelFacts, ep: Optional[int], dp: int, g: Group, nic: float,
          bm: int) -> tuple[Optional[tuple[int, float]], int]:
    """(EP argument of replica_cost, the rows its EP group routes per micro-batch) for a replica of
    group `g` in a stage of `dp` replicas and `bm` rows. `ep` None: one EP group over the whole DP
    group (its all_to_all on the slowest NIC); else EP groups of `ep` consecutive replicas of one kind
    (the search keeps ep | each kind's replica count), on the intra-node link when the group's
    ep x tp ranks fit a node, else the NIC. The bandwidth is per rank: each TP rank is in its own
    EP group (one TP index of every replica) and moves all the replica's tokens on its own link."""
    if not model.experts:
        return None, bm
    if ep is None:
        return ((dp, nic) if dp > 1 else None), bm
    bw = group_bw(g.facts, ep * g.tp <= g.facts.ranks_per_node)
    return ((ep, bw) if ep > 1 else None), g.mb * ep


def expert_reduce_time(eparams: float, ep: Optional[int], dp: int, kinds: Sequence[tuple[ChipFacts, int]]) -> float:
    """Expert data parallel: each expert's copies (one per EP group: dp / ep of them) SUM-reduce
    their fp32 gradients (`eparams` expert parameters per rank). The copies sit in different EP
    groups, so on different nodes (the NIC); across chip kinds the bridge's rail algorithm."""
    if ep is None or not eparams or dp // ep <= 1:
        return 0.0
    parts = [(f, n // ep, f.nic_bw) for f, n in kinds if n // ep]
    return dp_reduce_time(eparams * GRAD_BYTES, parts)


def ep_options(model: ModelFacts, counts: Sequence[int], even: bool = False) -> list[Optional[int]]:
    """EP degrees to try for stages whose kinds have `counts` replicas: None (one EP group over the
    whole DP group, experts placed by speed; needs experts >= replicas) and every divisor of the
    expert count that divides each kind's count (EP groups of one kind, even placement, experts
    replicated across groups: expert data parallel; e = d, one kind: one EP group over the DP group
    whose all_to_all runs on the intra-node link when it fits a node, which None prices on the NIC)."""
    if not model.experts:
        return [None]
    d = sum(counts)
    out: list[Optional[int]] = [None] if model.experts >= d and (not even or model.experts % d == 0) else []
    out += [e for e in divisors(model.experts) if e <= d and all(n % e == 0 for n in counts)]
    return out


def memory_options(build: Callable[[int], Shape], model: ModelFacts) -> Optional[tuple[Shape, float]]:
    """The cheapest ZeRO level that fits (recompute chosen per stage by `estimate`)."""
    best = None
    for zero in ZERO_LEVELS:
        shape = build(zero)
        est, fits = estimate(shape, model)
        if fits and (best is None or est < best[1]):
            best = (shape, est)
    return best




def runs_of(n: int, mb_lo: int, n_lo: int, e_lo: Optional[int], ne_lo: int) -> list[tuple[int, Optional[int], int]]:
    """Replicas 0..n-1 of one kind: the first n_lo get mb_lo rows (the rest mb_lo + 1), the first
    ne_lo host e_lo experts (the rest e_lo + 1): runs of identical (rows, experts, count)."""
    cuts = sorted({0, n, min(n_lo, n), min(ne_lo, n)})
    out = []
    for a, b in zip(cuts, cuts[1:]):
        if b > a:
            out.append((mb_lo if a < n_lo else mb_lo + 1,
                        None if e_lo is None else (e_lo if a < ne_lo else e_lo + 1), b - a))
    return out


def share_rows(total: int, counts: Sequence[int], times: Sequence[float]) -> Optional[list[tuple[int, int]]]:
    """Water-filling on kinds: per kind (rows of its first replicas, how many of them get those
    rows; the others get one more) with every replica >= 1 row, minimising max(rows x time)."""
    if total < sum(counts):
        return None

    def enough(level: float) -> bool:
        return sum(n * max(1, int(level / t)) for n, t in zip(counts, times)) >= total

    # The bisection needs `enough(hi)` true from the start. max(times) x total need not satisfy it in
    # floating point (3 x t / t can be 2.9999999999999996, whose int is 2): a cap one row short per
    # replica would make `excess` negative and lay out more replicas than a kind has. Hence: grow hi
    # until it satisfies.
    lo, hi = 0.0, max(times) * total
    while not enough(hi):
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        if enough(mid):
            hi = mid
        else:
            lo = mid
    cap = [max(1, int(hi / t)) for t in times]
    excess = sum(n * c for n, c in zip(counts, cap)) - total
    assert excess >= 0, (total, counts, times, cap)     # enough(hi) holds
    out = []
    for k in sorted(range(len(counts)), key=lambda k: -cap[k] * times[k]):
        take = min(excess, counts[k]) if cap[k] > 1 else 0
        excess -= take
        out.append((k, (cap[k] - 1, take) if take else (cap[k], counts[k])))
    if excess:
        return None
    res = [None] * len(counts)
    for k, v in out:
        res[k] = v
    # (rows_lo, n_lo): n_lo replicas with rows_lo, the rest rows_lo + 1
    return res


def expert_share(E: int, counts: Sequence[int], weights: Sequence[float]) -> Optional[list[tuple[int, int]]]:
    """Experts per replica by kind weight (largest remainder over replicas): per kind (e_lo, n_lo)."""
    per = place_experts(E, [w for w, n in zip(weights, counts) for _ in range(n)])
    if per is None:
        return None
    out, i = [], 0
    for n in counts:
        vals = per[i:i + n]
        i += n
        lo = min(vals)
        if max(vals) > lo + 1:
            return None
        out.append((lo, sum(1 for v in vals if v == lo)))
    return out
