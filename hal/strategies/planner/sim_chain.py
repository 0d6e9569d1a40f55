"""The step simulator's event pass for torch's multi-stage schedules: each rank group runs torch's own
action order, each action with its own cost, and the pass replays it.

  ZBVZeroBubble    hal/strategies/schedule.zbv_rank_order: F, I = input gradient, W = weight gradient, two
                   stages per rank group in a V (stage k on rank group k, or 2p - 1 - k past the turn)
  Interleaved1F1B  hal/strategies/schedule.interleaved_rank_order: F and B (the whole backward), v stages
                   per rank group round-robin (stage k on rank group k mod p), N micro-batches per round.
                   A micro-batch crosses p v - 1 boundaries; with N = p a round's first micro-batch comes
                   back to rank group 0 after p forwards and p sends, so slow sends open bubbles inside
                   the steady phase, which a closed form of the fill and drain cannot see

A ZBV layout is a set of equal chains (TorchPipeline's rule: every stage the same replicas, TP degree
and rows), so replica r of each rank group forms one chain that exchanges activations and gradients
only along itself; each distinct chain (its replicas' costs, chips and nodes) is replayed once. Per
action, from the rank group's `ReplicaCost` (sim_costs.stage_costs) cut by the chunk's share of the
group's layers (Layout.chunks where the layout states them):

  F   its forward (plus FSDP2's first-forward copies on micro-batch 0)
  B   (Interleaved1F1B) the whole backward, with the gradient accumulation and copies W has below
  I   the backward less its weight-gradient GEMMs (`ReplicaCost.bwd_weight`): the input-gradient
      GEMMs, the attention core's backward (no weights), recompute, TP communication, ZeRO-3's regather
  W   the weight-gradient GEMMs (Qi et al. 2023, arXiv 2401.10241, section 2: T_W ~ T_F for a
      layer's matmuls), the gradient accumulation after micro-batch 0, and on the last micro-batch
      DDP's bucket copy-in and FSDP2's gradient packing

An action waits for its rank group and its inputs: F(k, j) for F(k - 1, j) plus the send, I(k, j) (or B) for
F(k, j) and I(k + 1, j) plus the send; a send between two stages of one rank group (ZBV's middle
stages) is free. Sends do not queue behind one another (each is one activation of the boundary).
What this module approximates: a chunk's cost is the group's cost x its share of the layers (the head
and embedding are spread over their group's chunks; a synchronous send ModelFacts.megatron_p2p charges
the sender once per group, not per chunk), and the DP reduction follows the group's last action (torch
reduces each stage after its last W or B: DDP inside it, FSDP2 after it).
"""
from __future__ import annotations

from typing import Callable

from ..schedule import interleaved_rank_order, zbv_rank_order, zbv_stage_of
from .cost import ModelFacts, ReplicaCost, p2p_time
from .layout import Layout


def chunk_layers(n_layers: int, chunks: int) -> list[int]:
    """A rank group's layers cut into `chunks` consecutive chunks, the first ones one larger
    (convert.to_plan lays plan stages out the same way)."""
    base, extra = divmod(n_layers, chunks)
    return [base + (1 if c < extra else 0) for c in range(chunks)]


class ChainPass:
    """The pass over a ZBV layout (or, `interleaved`, an Interleaved1F1B one). After `run()` the same per
    [stage][replica][micro-batch] lists simulate.py reads of sim_events.EventPass: start_f (the rank
    group's first forward of j), start_b / done_b (start and end of its last W, or B, of j: where j's
    gradient is complete), red_at (empty: the reduction follows the last W or B) and `events` (Chrome
    trace, when `trace`). ValueError for unequal chains, or an M torch's interleaved order refuses."""

    def __init__(self, layout: Layout, model: ModelFacts, costs: list[list[ReplicaCost]],
                 ddp_in: list[list[float]], fsdp_copies: Callable[[int, int, str, int], float],
                 trace: bool, interleaved: bool = False) -> None:
        self.layout, self.model, self.costs = layout, model, costs
        self.ddp_in, self.fsdp_copies, self.trace = ddp_in, fsdp_copies, trace
        self.p, self.m = len(layout.stages), layout.m
        self.interleaved = interleaved
        self.v = layout.virtual if interleaved else 2
        n = [len(st.reps) for st in layout.stages]
        if len(set(n)) != 1:
            raise ValueError(f"{'Interleaved1F1B' if interleaved else 'ZBVZeroBubble'} replay needs equal chains "
                             f"(every rank group the same replicas); replicas per rank group: {n}")
        if interleaved:       # torch's own check (M a multiple of its rounds): raises here as there
            interleaved_rank_order(0, self.p, self.v, self.m, layout.per_round)
        self.nreps = n[0]
        m = self.m
        self.start_f = [[[0.0] * m for _ in st.reps] for st in layout.stages]
        self.start_b = [[[0.0] * m for _ in st.reps] for st in layout.stages]
        self.done_b = [[[0.0] * m for _ in st.reps] for st in layout.stages]
        self.red_at: dict[int, float] = {}
        self.events: list[dict] = []

    def run(self) -> "ChainPass":
        """Replay every distinct chain; RuntimeError when an order's dependencies cannot be met."""
        memo: dict[tuple, list] = {}
        for r in range(self.nreps):
            sends = [self._send(r, k, k + 1) for k in range(self.v * self.p - 1)]  # stage k -> k + 1, back
            key = self._chain_key(r, sends)
            if key not in memo or self.trace:
                memo[key] = self._replay(r, sends)
            for s, (sf, sb, db) in enumerate(memo[key]):
                self.start_f[s][r], self.start_b[s][r], self.done_b[s][r] = sf, sb, db
        return self

    def _chain_key(self, r: int, sends: list[float]) -> tuple:
        """What makes chain r's replay differ from another's: its costs, chips, rows and sends."""
        stages = self.layout.stages
        return tuple((id(self.costs[s][r]), id(st.reps[r].facts), len(st.reps[r].ranks), st.reps[r].mb,
                      self.ddp_in[s][r]) for s, st in enumerate(stages)) + tuple(sends)

    def _durations(self, s: int, r: int) -> dict[tuple[str, int], list[float]]:
        """Seconds of replica r of rank group s's actions: (kind, stage) -> per micro-batch. FSDP2's
        copies differ only on the first forward and the last backward (`fsdp_copy_bytes`)."""
        c, p, m = self.costs[s][r], self.p, self.m
        n = self.layout.stages[s].n_layers
        w, zero = c.bwd_weight, self.layout.zero
        if self.interleaved:
            return self._interleaved_durations(s, r)
        share = [x / n for x in chunk_layers(n, 2)] if n else [0.5, 0.5]

        def copies(kind: str, j: int) -> float:
            return self.fsdp_copies(s, r, kind, j) if zero >= 1 else 0.0

        f_first, f_rest = c.fwd + copies("F", 0), c.fwd + copies("F", min(1, m - 1))
        w_first = w + copies("B", 0) + (self.ddp_in[s][r] if m == 1 else 0.0)
        w_mid = w + c.grad_acc + copies("B", min(1, m - 1))
        w_last = w + (c.grad_acc if m > 1 else 0.0) + self.ddp_in[s][r] + copies("B", m - 1)
        out = {}
        for ch in (0, 1):
            k, f = zbv_stage_of(s, ch, p), share[ch]
            out[("F", k)] = [f * f_first] + [f * f_rest] * (m - 1)
            out[("I", k)] = [f * (c.bwd - w)] * m
            out[("W", k)] = ([f * w_first] + [f * w_mid] * (m - 2) + [f * w_last]) if m > 1 else [f * w_first]
        return out

    def _interleaved_durations(self, s: int, r: int) -> dict[tuple[str, int], list[float]]:
        """`_durations` for Interleaved1F1B: F and B per chunk (stage c p + s), B the whole backward."""
        c, p, m, v = self.costs[s][r], self.p, self.m, self.v
        lay = self.layout
        chunks = lay.chunks[s] if lay.chunks else chunk_layers(lay.stages[s].n_layers, v)
        total = sum(chunks)
        share = [x / total for x in chunks] if total else [1 / v] * v

        def copies(kind: str, j: int) -> float:
            return self.fsdp_copies(s, r, kind, j) if lay.zero >= 1 else 0.0

        f_first, f_rest = c.fwd + copies("F", 0), c.fwd + copies("F", min(1, m - 1))
        b_first = c.bwd + copies("B", 0) + (self.ddp_in[s][r] if m == 1 else 0.0)
        b_mid = c.bwd + c.grad_acc + copies("B", min(1, m - 1))
        b_last = c.bwd + (c.grad_acc if m > 1 else 0.0) + self.ddp_in[s][r] + copies("B", m - 1)
        out = {}
        for ch in range(v):
            k, f = ch * p + s, share[ch]
            out[("F", k)] = [f * f_first] + [f * f_rest] * (m - 1)
            out[("B", k)] = ([f * b_first] + [f * b_mid] * (m - 2) + [f * b_last]) if m > 1 else [f * b_first]
        return out

    def _group(self, stage: int) -> int:
        """The rank group that runs `stage`: round-robin (interleaved) or in a V (ZBV)."""
        p = self.p
        if self.interleaved:
            return stage % p
        return stage if stage < p else 2 * p - 1 - stage

    def _send(self, r: int, src_stage: int, dst_stage: int) -> float:
        """Seconds of one boundary activation (or its gradient) between two stages of chain r."""
        stages, node_of = self.layout.stages, self.layout.node_of or {}
        a = stages[self._group(src_stage)].reps[r]
        b = stages[self._group(dst_stage)].reps[r]
        if a.ranks == b.ranks:
            return 0.0
        same = bool(node_of) and node_of.get(a.ranks[0], -1) == node_of.get(b.ranks[0], -2)
        return p2p_time(a.mb * self.model.boundary_bytes() / len(a.ranks), a.facts, b.facts, same)

    def _replay(self, r: int, fwd_send: list[float]) -> list[tuple[list[float], list[float], list[float]]]:
        """Chain r: every rank group's actions settled in order; per rank group (start_f, start_b,
        done_b) per micro-batch. fwd_send[k]: seconds of a send between stage k and k + 1. Ends of
        F and I are kept per (stage, micro-batch) in flat lists (-1: not settled yet)."""
        p, m, S = self.p, self.m, self.v * self.p
        code = {"F": 0, "I": 1, "B": 1, "W": 2}
        last = 1 if self.interleaved else 2          # the action that completes j's gradient: B, or W
        queues = []
        for s in range(p):
            durs = self._durations(s, r)
            order = (interleaved_rank_order(s, p, self.v, m, self.layout.per_round) if self.interleaved
                     else zbv_rank_order(s, p, m))
            queues.append([(code[kind], k, j, durs[kind, k][j]) for kind, k, j in order])
        end_f, end_i = [-1.0] * (S * m), [-1.0] * (S * m)
        pos, free = [0] * p, [0.0] * p
        out = [([0.0] * m, [0.0] * m, [0.0] * m) for _ in range(p)]
        left = sum(len(q) for q in queues)
        while left:
            moved = 0
            for s in range(p):
                q, at, fr = queues[s], pos[s], free[s]
                start_f, start_b, done_b = out[s]
                while at < len(q):
                    kind, k, j, d = q[at]
                    x = k * m + j
                    if kind == 0:         # F: the previous stage's F of j and its send
                        ready = 0.0 if k == 0 else end_f[x - m] + fwd_send[k - 1] if end_f[x - m] >= 0 else -1.0
                    elif kind == 1 and k == S - 1:    # I of the last stage: its own F (earlier here)
                        ready = end_f[x]
                    elif kind == 1:       # I: its own F, and the next stage's I of j and its send
                        ready = -1.0 if end_i[x + m] < 0 else max(end_f[x], end_i[x + m] + fwd_send[k])
                    else:                 # W: its own I (earlier on this rank group: settled)
                        ready = end_i[x]
                    if ready < 0:
                        break
                    t0 = fr if fr > ready else ready
                    fr = t1 = t0 + d
                    if kind == 0:
                        end_f[x] = t1
                        if k == s:        # chunk 0's forward: the group's first of micro-batch j
                            start_f[j] = t0
                    elif kind == 1:
                        end_i[x] = t1
                    if kind == last and t1 >= done_b[j]:
                        start_b[j], done_b[j] = t0, t1
                    if self.trace:
                        self._trace(s, r, ("FBW" if self.interleaved else "FIW")[kind], k, j, t0, t1)
                    at += 1
                moved += at - pos[s]
                pos[s], free[s] = at, fr
            if not moved:
                name = "Interleaved1F1B" if self.interleaved else "ZBV"
                raise RuntimeError(f"{name} simulation of chain {r} deadlocked with {left} actions left "
                                   f"(rank groups at actions {pos})")
            left -= moved
        return out

    def _trace(self, s: int, r: int, kind: str, k: int, j: int, t0: float, t1: float) -> None:
        rep = self.layout.stages[s].reps[r]
        self.events.append({"name": f"{kind}{j}@{k}", "ph": "X", "ts": t0 * 1e6, "dur": (t1 - t0) * 1e6,
                            "pid": s, "tid": r, "args": {"ranks": list(rep.ranks), "chip": rep.facts.name,
                                                         "stage": k, "microbatch_rows": rep.mb}})
