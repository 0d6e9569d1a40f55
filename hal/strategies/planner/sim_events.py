"""The step simulator's event pass: start and end of every operation of the step, the longest path
through (each replica's schedule order) + (data dependencies between stages).

Each replica is one resource running its queue (sim_costs.op_queues) in order. A forward of
micro-batch j starts when the replica is free and every replica of the previous stage that owns
some of its rows has sent them; a backward also needs the gradients of those rows from the next
stage. A replica's sends leave one after another after the operation that produced them. Replicas
are visited from a worklist: one that cannot run its next operation waits until a send to it
arrives, so each operation is settled exactly once.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable


class EventPass:
    """Runs the pass over per-replica state lists indexed [stage][replica][micro-batch].

    `queues`, `fwd_out`, `bwd_out` come from sim_costs; `reduction(s, last start, last end)` is
    sim_reduction.reduction_end for this layout, needed here only when the runtime sends the last
    input gradients after the reduction (`send_after_reduction`). After `run()`: start_f / done_f /
    start_b / done_b per operation, `red_at` (stage -> reduction end, for the stages whose reduction
    the pass already placed) and `events` (Chrome trace, when `trace`)."""

    def __init__(self, stages, m: int, queues, fwd_out, bwd_out, reduction: Callable,
                 send_after_reduction: bool, trace: bool) -> None:
        self.stages, self.m, self.p = stages, m, len(stages)
        self.queues, self.fwd_out, self.bwd_out = queues, fwd_out, bwd_out
        self.reduction, self.send_after_reduction, self.trace = reduction, send_after_reduction, trace
        self.nreps = nreps = [len(st.reps) for st in stages]
        # inputs a forward / backward of (s, r) waits for (every micro-batch alike)
        self.need_f = [[0] * n for n in nreps]
        self.need_b = [[0] * n for n in nreps]
        for s in range(self.p):
            for i in range(nreps[s]):
                for k, _ in fwd_out[s][i]:
                    self.need_f[s + 1][k] += 1
                for k, _ in bwd_out[s][i]:
                    self.need_b[s - 1][k] += 1
        self.arr_f = [[[0.0] * m for _ in range(n)] for n in nreps]    # arrival of the last input, per op
        self.arr_b = [[[0.0] * m for _ in range(n)] for n in nreps]
        self.got_f = [[[0] * m for _ in range(n)] for n in nreps]
        self.got_b = [[[0] * m for _ in range(n)] for n in nreps]
        self.done_f = [[[None] * m for _ in range(n)] for n in nreps]
        self.done_b = [[[None] * m for _ in range(n)] for n in nreps]
        self.start_f = [[[0.0] * m for _ in range(n)] for n in nreps]
        self.start_b = [[[0.0] * m for _ in range(n)] for n in nreps]
        self.pos = [[0] * n for n in nreps]
        self.free = [[0.0] * n for n in nreps]
        self.last_b: dict[int, list] = defaultdict(list)   # stage -> (replica, start, end) of its last backward
        self.red_at: dict[int, float] = {}                 # stage -> end of its DP reduction, once known
        self.events: list[dict] = []

    def run(self) -> "EventPass":
        """Settle every operation; RuntimeError when the dependencies cannot all be met."""
        total = sum(len(self.queues[s][0]) * self.nreps[s] for s in range(self.p) if self.nreps[s])
        finished = 0
        work = [(s, r) for s in range(self.p) for r in range(self.nreps[s])]
        while work:
            nxt: list = []
            progressed = 0
            for s, r in work:
                progressed += self._advance(s, r, nxt)
            finished += progressed
            work = list(dict.fromkeys(nxt))
            if not progressed and finished < total and not work:
                break
        if finished < total:
            raise RuntimeError(f"simulation deadlocked after {finished} of {total} operations "
                               "(a schedule whose dependencies cannot be met)")
        return self

    def _advance(self, s: int, r: int, nxt: list) -> int:
        """Run replica (s, r)'s operations until one lacks an input; returns how many ran and
        appends the replicas its sends reached to `nxt`."""
        ops = self.queues[s][r]
        nops = len(ops)
        pr = start = self.pos[s][r]
        fr = self.free[s][r]
        while pr < nops:
            is_f, j, d, ddp, fs = ops[pr]
            if is_f:
                if self.got_f[s][r][j] < self.need_f[s][r]:
                    break
                arr = self.arr_f[s][r][j]
            else:
                if self.got_b[s][r][j] < self.need_b[s][r] or self.done_f[s][r][j] is None:
                    break
                arr = self.arr_b[s][r][j]
            t0 = fr if fr >= arr else arr
            t1 = t0 + d
            if ddp:
                t1 += ddp
            if fs:
                t1 += fs
            if is_f:
                self.done_f[s][r][j], self.start_f[s][r][j] = t1, t0
            else:
                self.done_b[s][r][j], self.start_b[s][r][j] = t1, t0
            fr = t1
            pr += 1
            if self.trace:
                self._trace_op(s, r, is_f, j, t0, t1)
            if is_f:
                self._send_forward(s, r, j, t1, nxt)
            else:
                self._send_backward(s, r, j, t0, t1, nxt)
        self.pos[s][r] = pr
        self.free[s][r] = fr
        return pr - start

    def _send_forward(self, s: int, r: int, j: int, t_send: float, nxt: list) -> None:
        """Replica (s, r)'s activations of micro-batch j to the next stage, leaving from t_send."""
        if s >= self.p - 1:
            return
        af, gf = self.arr_f[s + 1], self.got_f[s + 1]
        for k, dt in self.fwd_out[s][r]:
            t_send += dt
            if t_send > af[k][j]:
                af[k][j] = t_send
            gf[k][j] += 1
            nxt.append((s + 1, k))

    def _send_backward(self, s: int, r: int, j: int, t0: float, t1: float, nxt: list) -> None:
        """Replica (s, r)'s input gradients of micro-batch j to the previous stage. With
        `send_after_reduction`, the last backward returns only after the stage's DP reduction when
        that runs inside backward: every replica's sends wait for the whole stage and for it."""
        if s == 0:
            return
        if j == self.m - 1 and self.nreps[s] > 1 and self.send_after_reduction:
            lb = self.last_b[s]
            lb.append((r, t0, t1))
            if len(lb) < self.nreps[s]:
                return
            self.red_at[s], inside = self.reduction(s, max(x[1] for x in lb), max(x[2] for x in lb))
            leave = [(rr, self.red_at[s] if inside else t_end) for rr, _, t_end in lb]
        else:
            leave = [(r, t1)]
        ab, gb = self.arr_b[s - 1], self.got_b[s - 1]
        for rr, t_send in leave:
            for i, dt in self.bwd_out[s][rr]:
                t_send += dt
                if t_send > ab[i][j]:
                    ab[i][j] = t_send
                gb[i][j] += 1
                nxt.append((s - 1, i))

    def _trace_op(self, s: int, r: int, is_f: bool, j: int, t0: float, t1: float) -> None:
        """One Chrome trace event for an operation (process = stage, thread = replica)."""
        rep = self.stages[s].reps[r]
        self.events.append({"name": f"{'F' if is_f else 'B'}{j}", "ph": "X", "ts": t0 * 1e6,
                            "dur": (t1 - t0) * 1e6, "pid": s, "tid": r,
                            "args": {"ranks": list(rep.ranks), "chip": rep.facts.name,
                                     "microbatch_rows": rep.mb}})
