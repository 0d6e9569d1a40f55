"""Per-step metrics of a `hal train` run: what each rank measures, the record rank 0 writes to
`metrics.jsonl` (and hands to the metric sinks, hal.trainer.sinks: TensorBoard, `[log] sinks`), the live
progress display, and the run's figures for `summary.json`.

What is MEASURED on every rank, every step (gathered on the bookkeeping gloo group):
  - `step_s`: wall time of the rank's step (forward + backward + gradient sync + grad norm + optimizer);
  - `compute_s`: the rank's own compute. Under timed emulation (HAL_EMULATE_TIMED=1, hal.emulation.timed) it is
    the virtual seconds the emulated chip's ops were charged (`clock.stats()["busy_s"]`) plus the
    clock's overrun seconds (time the host, not the chip, was the limit); otherwise the main thread's
    CPU time (`time.thread_time()`: the training thread's forward, backward and optimizer; the
    bridge's executor threads are not in it);
  - `device_s`: under timed emulation the chip's own time (`busy_s` alone), what the slow-node detector
    reads; otherwise the thread CPU time;
  - `wait_s = step_s - compute_s`: time in collectives and waiting for peers (pipeline bubble
    included), as that remainder;
  - the step split apart (`rank_bubble_s`, `rank_comm_s`, `rank_compute_s`, `rank_other_s`, and each
    as a share of the rank's step), MEASURED, not derived from a formula:
      under timed emulation, on the chip's virtual timeline (hal.emulation.timed): `bubble_s` = the time the
      emulated chip sat idle until a point-to-point receive/send completed (a pipeline stage waiting
      for its neighbour's activations or gradients; `wait_p2p_s`), `comm_s` = idle until any other
      collective completed (DP gradient all_reduce / reduce-scatter, TP and EP collectives, the
      step's loss and grad-norm reductions; `wait_collective_s`: the transfer itself and waiting for
      the slowest peer to arrive), `compute_s` as above, `other_s` = the rest (the host's own time:
      Python between ops, data);
      without timed emulation, from the host: `bubble_s` = wall time the training thread was blocked
      in pipeline receives (HeteroPipeline.recv_wait_s; null on torch's pipelining schedules, which
      wait inside torch), `comm_s` = the rest of the time the thread was off its CPU (blocked in
      collectives, waiting for peers, and, on an oversubscribed host such as this 2-core one with
      emulated ranks, waiting for a core), `compute_s` = its CPU time;
    `bubble_est` is the 1F1B formula (p-1)/(m+p-1) of the plan, an ESTIMATE kept to compare with.
  - under timed emulation also the FLOPs and bytes the clock charged (hal.emulation.timed's counters), which the
    slow-node detector turns into each rank's expected time (hal.trainer.slow_node).

Derived on rank 0: tokens/s overall (global batch tokens / slowest rank's step), tokens/s and MFU per
chip kind. A rank's work share is the fraction of the model's training FLOPs its plan role does
(its stage's layer FLOPs and the head on the last stage, x its replica's rows / micro-batch rows, / TP
degree); a chip kind's tokens/s is its ranks' shares x global tokens / step time (token-equivalents:
with PP a token passes through several chips), its MFU their share of the model FLOPs per step
(ModelConfig.train_flops, no recompute) / step time / the sum of its ranks' peaks. The peak is the
chip profile's peak FLOP/s of the charged dtype; under timed emulation divided by the time scale (the
emulated chip's wall-time peak: its ops are charged from the chip efficiency matrix, at best its best
fraction x peak / scale, so MFU tops out near that fraction); without timed emulation the chip runs at
the host CPU's speed and the MFU against its profile peak is printed but means nothing about the chip
(summary says which peak).
"""
from __future__ import annotations

import json
import logging
import math
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from hal import envs

_EXPERT = re.compile(r"\.experts\.(\d+)\.")
log = logging.getLogger(__name__)


# ---- timed emulation -----------------------------------------------------------------------------
def timed_clock(acc) -> Optional[Any]:
    """This rank's hal.emulation.timed clock, installing one when HAL_EMULATE_TIMED=1 asks for it and the
    accelerator binding did not (an emulated chip only); None when timed emulation is off."""
    if not acc.emulated:
        return None
    try:
        from hal.emulation import timed
    except ImportError:  # an older hal without timed emulation
        return None
    clock = timed.active_clock()
    if clock is None and timed.timed_requested():
        clock = timed.clock_from_env(acc.chip.name, acc.profile)
        timed.install(clock)
    return clock


# ---- work shares ---------------------------------------------------------------------------------
def work_shares(plan, model_cfg, world: int) -> list[float]:
    """Fraction of the model's training FLOPs each rank does under `plan` (sums to 1 over the world)."""
    seq = model_cfg.seq
    layer = float(model_cfg.layer_flops(seq))
    head = float(model_cfg.head_flops(seq))
    total = model_cfg.layers * layer + head
    out = [0.0] * world
    last = len(plan.stages) - 1
    for si, st in enumerate(plan.stages):
        lo, hi = st.layers
        frac = ((hi - lo) * layer + (head if si == last else 0.0)) / total
        mb = sum(r.microbatch for r in st.replicas)
        for rep in st.replicas:
            for r in rep.ranks:
                out[r] += frac * rep.microbatch / mb / len(rep.ranks)
    return out


def bubble_estimate(plan) -> float:
    """1F1B/GPipe bubble fraction (p-1)/(m+p-1) (REFERENCE.md); 0 without pipeline stages."""
    p, m = len(plan.stages), plan.num_microbatches
    return (p - 1) / (m + p - 1) if p > 1 else 0.0


# ---- gradient norm -------------------------------------------------------------------------------
def global_grad_norm(run, plan, rank: int, group) -> float:
    """L2 norm of the whole model's gradient, each parameter element counted once over the world:
    a DTensor gradient counts on ranks at coordinate 0 of its Replicate mesh dims; a gradient
    replicated over DP (plain tensor, or a DTensor whose mesh is inside one replica) counts on replica 0
    of its stage (an expert's on the first replica hosting that expert); plain tensors on TP index 0.
    Collective on `group` (every rank calls it)."""
    from torch.distributed.tensor import DTensor, Replicate
    sq = torch.zeros(1, dtype=torch.float64)
    for s, mod in run.modules.items():
        st = plan.stages[s]
        role = next(r for r in plan.roles(rank) if r.stage == s)
        others = {x for i, rep in enumerate(st.replicas) if i != role.replica for x in rep.ranks}
        inner = getattr(mod, "module", mod)
        for name, p in inner.named_parameters():
            g = p.grad
            if g is None:
                continue
            m = _EXPERT.search("." + name)
            if isinstance(g, DTensor):
                coords = g.device_mesh.get_coordinate() or []
                if any(isinstance(pl, Replicate) and c != 0 for pl, c in zip(g.placements, coords)):
                    continue
                spans_dp = bool(others & set(g.device_mesh.mesh.flatten().tolist()))
                local = g._local_tensor
            else:
                if role.tp_index != 0:
                    continue
                spans_dp, local = False, g
            if not spans_dp:
                if m is not None and st.experts is not None:
                    e = int(m.group(1))
                    holders = [i for i, ids in enumerate(st.experts) if e in ids]
                    if holders and role.replica != holders[0]:
                        continue
                elif role.replica != 0:
                    continue
            sq += local.detach().double().pow(2).sum()
    dist.all_reduce(sq, group=group)
    return float(sq.sqrt())


# ---- live display --------------------------------------------------------------------------------
class Display:
    """rich progress bar (step, loss, tokens/s, time left) when stdout is a terminal; plain lines
    every `print_interval` steps otherwise (CI, a log file, torchrun's piped output). rich (the [train]
    extra) is imported only for the bar."""

    def __init__(self, total: int, start: int, interval: int) -> None:
        self.total, self.interval = total, interval
        self._bar = self._task = None
        if sys.stdout.isatty() and not envs.HAL_TRAIN_PLAIN.get():
            try:
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
                self._bar = Progress(TextColumn("hal train"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("{task.fields[info]}"), TimeRemainingColumn(), transient=False)
                self._task = self._bar.add_task("train", total=total, completed=start, info="")
                self._bar.start()
            except Exception:  # rich missing or no usable terminal: plain lines
                self._bar = None

    def update(self, rec: dict, eta_s: float) -> None:
        done = rec["step"]
        info = (f"loss {rec['loss']:.4f}  {rec['tokens_per_s']:,.0f} tok/s"
                + (f"  val {rec['val_loss']:.4f}" if "val_loss" in rec else ""))
        if self._bar is not None:
            self._bar.update(self._task, completed=done, info=info)
        if done % self.interval == 0 or done == self.total or "val_loss" in rec:
            line = (f"  step {done}/{self.total}  loss {rec['loss']:.4f}  lr {rec['lr']:.2e}  "
                    f"gnorm {rec['grad_norm']:.3f}  {rec['tokens_per_s']:,.0f} tok/s  eta {eta_s:.0f}s"
                    + (f"  val {rec['val_loss']:.4f}" if "val_loss" in rec else ""))
            if self._bar is not None:
                self._bar.console.print(line)
            else:
                log.info("%s", line)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


# ---- the run's metrics ---------------------------------------------------------------------------
# per rank: step_s, compute_s, thread cpu s, clock flops, clock bytes, overruns, overrun_s, device s,
# bubble_s, comm_s (NaN: not measured), link issue s (hal/trainer/link_watch.py)
_FIELDS = 11


def split_step(step_s: float, compute_s: float, bubble_s: Optional[float], comm_s: Optional[float]) -> dict:
    """One rank's step split into compute, pipeline bubble, communication and the rest (seconds and
    shares of its step; None where not measured). compute_s is capped at the step; the rest is never
    negative (the parts are measured independently and can overlap by a clock's jitter)."""
    compute_s = min(compute_s, step_s)
    known = [x for x in (bubble_s, comm_s) if x is not None]
    other = max(0.0, step_s - compute_s - sum(known)) if len(known) == 2 else None

    def share(x: Optional[float]) -> Optional[float]:
        return None if x is None else (x / step_s if step_s > 0 else 0.0)
    return {"compute_s": compute_s, "bubble_s": bubble_s, "comm_s": comm_s, "other_s": other,
            "compute_share": share(compute_s), "bubble_share": share(bubble_s), "comm_share": share(comm_s)}


class RunMetrics:
    """Measures every rank's step and, on rank 0, writes metrics.jsonl, drives the display and the
    slow-node detector. Every rank calls `begin`/`end` each step (end is a collective on `book`)."""

    def __init__(self, cfg, plan, model_cfg, run, chips: list, book, acc, start: int,
                 throttle: Optional[Callable[[Any], float]] = None) -> None:
        """`throttle(clock) -> factor`: the test-only chip throttle (hal.trainer.debug), applied after the
        profile's speeds are read, so the slow-node check expects the chip's real speed."""
        from .slow_node import SlowNodeDetector
        self.cfg, self.plan, self.model_cfg, self.run, self.book = cfg, plan, model_cfg, run, book
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.start = start
        self.clock = timed_clock(acc)
        speeds = (self.clock.speeds.flops_per_s, self.clock.speeds.bytes_per_s) if self.clock else (0.0, 0.0)
        self.throttle = throttle(self.clock) if throttle is not None else 0.0
        dtype = self.clock.dtype if self.clock else _dtype_key(run)
        scale = self.clock.scale if self.clock else 1.0
        peak = acc.profile.peak(dtype)
        peak_source = f"catalog {acc.profile.model} {dtype} peak"
        if not peak and self.clock is not None:
            peak = self.clock.speeds.peak_flops_per_s * scale
            peak_source = f"{dtype} peak as timed emulation assumes it ({self.clock.speeds.source})"
        mine = {"model": acc.profile.model, "dtype": dtype, "peak": peak or 0.0, "peak_source": peak_source,
                "scale": scale, "flops_per_s": speeds[0], "bytes_per_s": speeds[1],
                "timed": self.clock is not None, "throttle": self.throttle}
        info: list = [None] * self.world
        dist.all_gather_object(info, mine, group=book)
        self.info = info
        self.timed = all(i["timed"] for i in info)
        self.chips = [c["chip"] for c in chips]
        self.emulated = [bool(c["emulated"]) for c in chips]
        self.shares = work_shares(plan, model_cfg, self.world)
        self.tokens = cfg.global_batch * model_cfg.seq
        self.step_flops = float(model_cfg.train_flops(self.tokens))
        self.bubble = bubble_estimate(plan)
        self.records: list[dict] = []
        self.detector = SlowNodeDetector(cfg.slow_node.threshold, cfg.slow_node.window, self.chips, self.shares,
                                         [(i["flops_per_s"], i["bytes_per_s"]) for i in info], self.timed)
        self.slow_logged: set[int] = set()
        self._file = None
        self.display = None
        self.sinks = None
        if self.rank == 0:
            from .sinks import Sinks, open_sinks
            cfg.run_dir.mkdir(parents=True, exist_ok=True)
            self._file = open(cfg.run_dir / "metrics.jsonl", "a", encoding="utf-8")
            self.display = Display(cfg.last_step, start, cfg.log.print_interval)
            self.sinks = Sinks(open_sinks(cfg, self.chips), self.chips)  # TensorBoard and [log] sinks
        self._t_run = time.perf_counter()

    # -- per step ---------------------------------------------------------------------------------
    def _sample(self) -> tuple:
        st = self.clock.stats() if self.clock is not None else None
        recv = getattr(self.run.runtime, "recv_wait_s", None) if self.run.runtime is not None else 0.0
        return (time.perf_counter(), time.thread_time(), st, recv)

    def begin(self) -> None:
        if self.clock is not None:
            self.clock.sync()  # the previous step's device work is done before this step's clock starts
        self._t0 = self._sample()

    def end(self, done: int, loss: float, lr: float, grad_norm: float, link_issue_s: float = 0.0) -> dict:
        """Collective on the bookkeeping group: gathers every rank's timings (and `link_issue_s`, this
        rank's seconds submitting to its links: hal/trainer/link_watch.py) in one all_gather; returns the
        step's record (complete on rank 0)."""
        if self.clock is not None:
            self.clock.sync()  # the step ends when this chip's last op would have
        t1 = self._sample()
        (w0, c0, s0, r0), (w1, c1, s1, r1) = self._t0, t1
        nan = float("nan")
        mine = [w1 - w0, c1 - c0, c1 - c0, 0.0, 0.0, 0.0, 0.0, c1 - c0, nan, nan, link_issue_s]
        if s0 is not None:
            mine[7] = s1["busy_s"] - s0["busy_s"]  # the emulated chip's own time (its ops at its speed)
            mine[1] = mine[7] + (s1["overrun_s"] - s0["overrun_s"])
            mine[3], mine[4] = s1["flops"] - s0["flops"], s1["bytes"] - s0["bytes"]
            mine[5], mine[6] = s1["overrun_count"] - s0["overrun_count"], s1["overrun_s"] - s0["overrun_s"]
            # the chip's idle time until a p2p op / another collective completed (hal.emulation.timed's timeline)
            mine[8] = s1.get("wait_p2p_s", nan) - s0.get("wait_p2p_s", nan)
            mine[9] = s1.get("wait_collective_s", nan) - s0.get("wait_collective_s", nan)
        elif r0 is not None:  # the host's view: blocked in pipeline receives; the rest off-CPU is comm
            mine[8] = r1 - r0
            mine[9] = max(0.0, mine[0] - mine[1] - mine[8])
        parts = [torch.zeros(_FIELDS, dtype=torch.float64) for _ in range(self.world)]
        dist.all_gather(parts, torch.tensor(mine, dtype=torch.float64), group=self.book)
        rows = [p.tolist() for p in parts]
        step_s = [r[0] for r in rows]
        compute_s = [min(r[1], r[0]) for r in rows]
        wait_s = [max(0.0, s - c) for s, c in zip(step_s, compute_s)]
        slowest = max(step_s)
        rec: dict[str, Any] = {"step": done, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                               "tokens_per_s": self.tokens / slowest, "step_s": slowest,
                               "rank_step_s": step_s, "rank_compute_s": compute_s, "rank_wait_s": wait_s,
                               "rank_device_s": [r[7] for r in rows], "rank_link_issue_s": [r[10] for r in rows],
                               "rank_wait_share": [w / s if s > 0 else 0.0 for w, s in zip(wait_s, step_s)],
                               "bubble_est": self.bubble, "time": time.time()}
        splits = [split_step(r[0], r[1], *(None if math.isnan(x) else x for x in r[8:10])) for r in rows]
        for key in ("bubble_s", "comm_s", "other_s", "compute_share", "bubble_share", "comm_share"):
            rec[f"rank_{key}"] = [sp[key] for sp in splits]
        per_chip: dict[str, dict] = {}
        for r, chip in enumerate(self.chips):
            d = per_chip.setdefault(chip, {"share": 0.0, "peak": 0.0})
            d["share"] += self.shares[r]
            d["peak"] += self.info[r]["peak"] / self.info[r]["scale"]
        rec["tokens_per_s_chip"] = {k: d["share"] * self.tokens / slowest for k, d in per_chip.items()}
        rec["mfu_chip"] = {k: (d["share"] * self.step_flops / slowest / d["peak"]) if d["peak"] else None
                           for k, d in per_chip.items()}
        if self.clock is not None or self.timed:
            rec["rank_overruns"] = [int(r[5]) for r in rows]
            rec["rank_overrun_s"] = [r[6] for r in rows]  # host-bound time inside compute_s
        found = self.detector.update([r[7] for r in rows], [r[3] for r in rows], [r[4] for r in rows])
        if found:
            rec["slow_ranks"] = [f["rank"] for f in found]
            if self.rank == 0:
                for f in found:
                    if f["rank"] not in self.slow_logged:
                        self.slow_logged.add(f["rank"])
                        log.info("  SLOW NODE at step %d: %s", done, self.detector.describe(f))
        return rec

    def write(self, rec: dict) -> None:
        """Rank 0: append the record, update the display."""
        if self.rank != 0:
            return
        self.records.append(rec)
        self._file.write(json.dumps(rec) + "\n")
        self._file.flush()
        self.sinks.write(rec["step"], rec)
        done = rec["step"]
        eta = (self.cfg.last_step - done) * (time.perf_counter() - self._t_run) / max(1, done - self.start)
        self.display.update(rec, eta)

    def write_sinks(self, step: int, rec: dict) -> None:
        """Rank 0: figures that are not a step record (the final validation loss) to the sinks only."""
        if self.sinks is not None:
            self.sinks.write(step, rec)

    def close(self) -> None:
        if self.sinks is not None:
            self.sinks.close()
        if self.display is not None:
            self.display.close()
        if self._file is not None:
            self._file.close()
            self._file = None

    # -- the run's figures ------------------------------------------------------------------------
    def summary(self) -> dict:
        """Rank 0: the figures summary.json gets from the steps of this run (median over the steps after
        the first `efficiency.skip`, which hold start-up and first-touch costs)."""
        recs = [r for r in self.records]
        skip = min(self.cfg.efficiency.skip, max(0, len(recs) - 1))
        steady = recs[skip:] or recs
        med = (lambda xs: statistics.median(xs) if xs else None)
        out: dict[str, Any] = {
            "tokens_per_s_median": med([r["tokens_per_s"] for r in steady]),
            "step_s_median": med([r["step_s"] for r in steady]),
            "tokens_per_s_chip_median": {k: med([r["tokens_per_s_chip"][k] for r in steady])
                                         for k in (steady[0]["tokens_per_s_chip"] if steady else {})},
            "mfu_chip_median": {k: med([r["mfu_chip"][k] for r in steady if r["mfu_chip"][k] is not None])
                                for k in (steady[0]["mfu_chip"] if steady else {})},
            "rank_step_s_median": [med([r["rank_step_s"][i] for r in steady]) for i in range(self.world)],
            "rank_device_s_median": [med([r["rank_device_s"][i] for r in steady]) for i in range(self.world)],
            "rank_wait_share_median": [med([r["rank_wait_share"][i] for r in steady]) for i in range(self.world)],
            "bubble_est": self.bubble, "steps_measured": len(steady), "steps_skipped": skip,
            "timed_emulation": self.timed,
            "compute_measure": ("hal.emulation.timed virtual clock busy_s + overrun_s" if self.timed
                                else "main-thread CPU time (time.thread_time)"),
            "mfu_peaks": {c: {"model": i["model"], "dtype": i["dtype"], "peak_flops": i["peak"],
                              "time_scale": i["scale"], "source": i["peak_source"],
                              "used": (f"{i['dtype']} peak / time scale {i['scale']:g} (timed emulation)"
                                       if i["timed"] else f"{i['dtype']} profile peak; chip EMULATED at host CPU "
                                       f"speed, so this MFU says nothing about the chip")}
                          for c, i in zip(self.chips, self.info)},
            "work_shares": self.shares,
            "split_measure": ("hal.emulation.timed virtual timeline: bubble = chip idle until p2p ops completed, "
                              "comm = "
                              "idle until other collectives completed" if self.timed else
                              "host: bubble = training thread blocked in pipeline receives, comm = the rest "
                              "of its off-CPU time (collectives, peers, and CPU contention)"),
            "slow_nodes": self.detector.findings(),
            "throttled": [{"rank": r, "factor": i["throttle"]} for r, i in enumerate(self.info) if i["throttle"]],
        }
        for key in ("compute", "bubble", "comm", "other"):  # each rank's median split of its step
            for unit in ("s", "share"):
                if key == "other" and unit == "share":
                    continue
                field = f"rank_{key}_{unit}"
                out[f"{field}_median"] = [med([r[field][i] for r in steady if len(r.get(field) or ()) > i
                                               and r[field][i] is not None]) for i in range(self.world)]
        if self.timed:
            out["overruns"] = sum(sum(r.get("rank_overruns", [0])) for r in recs)
            out["overrun_share"] = (sum(sum(r.get("rank_overrun_s", [0.0])) for r in steady)
                                    / max(1e-12, sum(sum(r["rank_compute_s"]) for r in steady)))
        return out


def _dtype_key(run) -> str:
    params = run.parameters()
    dt = params[0].dtype if params else torch.float32
    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
            torch.float64: "float64"}.get(dt, "float32")


def read_metrics(path: Path) -> list[dict]:
    """The records of a metrics.jsonl (a resumed run appends to it: the last record of each step wins)."""
    by_step: dict[int, dict] = {}
    if Path(path).is_file():
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if line:
                rec = json.loads(line)
                if "step" in rec:
                    by_step[rec["step"]] = rec
    return [by_step[k] for k in sorted(by_step)]


def fmt_rate(x: Optional[float]) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:,.0f}"
