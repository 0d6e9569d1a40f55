"""Mid-run re-plan of `hal train` when the slow-node check confirms a slow rank (`slow_node.replan = true`).

At the end of the step where hal.trainer.slow_node's detector first flags a rank (every rank reaches the
same decision: the detector reads the same all-gathered figures on every rank), each rank:

  1. re-weights the plan (slow_node.replan: each replica's rows in proportion to its measured rows per
     device-second over the detector's window; layers, TP groups, experts unchanged);
  2. when this job can be restarted - under torchrun with restarts left (`hal train --max-restarts N`,
     N >= 1: TORCHELASTIC_MAX_RESTARTS - TORCHELASTIC_RESTART_COUNT > 0) and checkpoints enabled - writes
     a synchronous checkpoint of this step (hal.trainer.checkpoint), rank 0 writes `<run dir>/replan.json` and
     a `replan` record in `<run dir>/elastic.json` (hal.trainer.elastic), a barrier, and every rank raises
     `ReplanRequested`: hal.trainer.elastic.exit_failed ends it with EXIT_REPLAN (75), torchrun restarts the
     job, and the new job (`choose_plan`) runs on replan.json - resuming from that checkpoint (it
     reshards: the rows moved) with no step lost. The restarted job's first completed step closes the
     record with `restart_s` (decision to that step: the time the re-plan cost, one step of work in it);
  3. otherwise (not under torchrun, `--max-restarts 0`, no restart left, or checkpoints off) rank 0
     writes replan.json, logs `re-plan recommended ... restart with --plan <run dir>/replan.json`, and the
     run goes on on its plan (summary.json `replan_recommended`).

Each rank is re-planned for at most once per run (a throttled chip stays slower than its profile after
its rows are cut, so the detector flags it again in the new job; the ranks already weighted down are
read back from elastic.json). A plan that cannot move rows (one replica per stage) is logged and left.
"""
from __future__ import annotations

import json
import logging
import os
import statistics
import time
from typing import Optional

import torch.distributed as dist

from hal.contract.errors import HalError

from .data import replica_rows
from .elastic import STATE

log = logging.getLogger(__name__)
EXIT_REPLAN = 75  # a rank's exit code for "restart me on the re-plan" (os.EX_TEMPFAIL's number)
FILE = "replan.json"


class ReplanRequested(HalError):
    """Every rank raises it after the re-plan's checkpoint and replan.json are written; under torchrun the
    rank exits with EXIT_REPLAN and torchrun restarts the job on the new plan."""


def restarts_left(env: Optional[dict] = None) -> Optional[int]:
    """Restarts torchrun has left for this job; None outside torchrun."""
    env = os.environ if env is None else env
    if not env.get("TORCHELASTIC_RUN_ID"):
        return None
    try:
        return int(env.get("TORCHELASTIC_MAX_RESTARTS", "0")) - int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    except ValueError:
        return None


def rank_rows(plan, rank: int) -> int:
    """Rows of the global batch `rank` reads per step (all its micro-batches)."""
    return sum(hi - lo for lo, hi in replica_rows(plan, rank))


def layout(plan) -> list[str]:
    """One line per stage: `stage i: [ranks]xrows, ...` (old/new plan in the replan record)."""
    return [f"stage {i}: " + ", ".join(f"{r.ranks}x{r.microbatch}" for r in st.replicas)
            for i, st in enumerate(plan.stages)]


def choose_plan(cfg, plan, topo, model_cfg, book):
    """At start, every rank (collective on `book`): when this run re-planned mid-run before (elastic.json
    lists `replans`) and `<run dir>/replan.json` fits this cluster and model, the plan to run is that one.
    Returns (plan, ranks already weighted down by this run)."""
    from hal.strategies.plan import Plan
    box: list = [None]
    if dist.get_rank() == 0:
        box[0] = (None, [])
        path = cfg.run_dir / FILE
        try:
            reps = json.loads((cfg.run_dir / STATE).read_text()).get("replans") or []
        except (OSError, ValueError):
            reps = []
        done = sorted({r for x in reps for r in x.get("ranks", [])})
        if cfg.slow_node.replan and reps and path.is_file():
            try:
                new = Plan.from_json(path.read_text())
                new.check(topo, model_cfg)
                if new.global_batch != cfg.global_batch:
                    raise ValueError(f"global batch {new.global_batch} != the config's {cfg.global_batch}")
                box[0] = (new.to_json(indent=None), done)
                log.info(f"hal train: running on the re-plan {path} (slow rank(s) {done} weighted down)")
            except Exception as exc:  # a different cluster since: plan as configured
                box[0] = (None, done)
                log.info(f"hal train: {path} does not fit this cluster ({type(exc).__name__}: {exc}); "
                    f"planning as configured ({cfg.plan.source})")
    dist.broadcast_object_list(box, src=0, group=book)
    text, done = box[0]
    return (Plan.from_json(text) if text else plan), set(done)


class MidRunReplan:
    """One rank's side of the mid-run re-plan (module doc). `after_step` runs on every rank after each
    step's checkpoint; it may raise ReplanRequested."""

    def __init__(self, cfg, plan, rank: int, elastic, book, done: set) -> None:
        self.cfg, self.plan, self.rank, self.elastic, self.book = cfg, plan, rank, elastic, book
        self.enabled = cfg.slow_node.replan
        self.done = set(done)  # ranks this run already weighted down
        self.recommended: list[dict] = []

    def after_step(self, done_step: int, detector, saver, records: list) -> None:
        """`records`: rank 0's metrics records of this job (tokens/s before the re-plan)."""
        if not self.enabled or done_step >= self.cfg.last_step:
            return
        new = [f for f in detector.findings() if f["rank"] not in self.done]
        if not new:
            return
        ranks = [f["rank"] for f in new]
        self.done.update(ranks)
        # what the detector measured: each rank's median device (compute) seconds over its window
        med = [statistics.median(x[1] for x in h) if h else 0.0 for h in detector.hist]
        from .slow_node import replan
        try:
            plan = replan(self.plan, med)
        except Exception as exc:  # a plan the re-weighting cannot express: say so, train on
            if self.rank == 0:
                log.info(f"  SLOW NODE: no re-plan for rank(s) {ranks}: {type(exc).__name__}: {exc}")
            return
        path = self.cfg.run_dir / FILE
        rec = {"step": done_step, "ranks": ranks, "chips": [f["chip"] for f in new],
               "slowdown": [f["slowdown"] for f in new], "old_plan": layout(self.plan), "new_plan": layout(plan),
               "rows_before": {str(r): rank_rows(self.plan, r) for r in ranks},
               "rows_after": {str(r): rank_rows(plan, r) for r in ranks},
               "decided_time": time.time(), "path": str(path),
               "tokens_per_s_before": statistics.median(r["tokens_per_s"] for r in records) if records else None}
        if plan.to_json() == self.plan.to_json():
            if self.rank == 0:
                log.info(f"  SLOW NODE: rank(s) {ranks} cannot be weighted down on this plan "
                         f"(no other replica in its stage to take rows); no re-plan")
            return
        if self.rank == 0:
            path.write_text(plan.to_json() + "\n")
        left = restarts_left()
        why = ("not under torchrun" if left is None else
               "hal train --max-restarts 0" if left <= 0 and os.environ.get("TORCHELASTIC_MAX_RESTARTS") == "0" else
               "no torchrun restart left" if left <= 0 else
               "checkpoints are disabled (checkpoint.enabled = false)" if saver is None else None)
        if why is not None:
            rec.update({"action": "recommended", "why": why})
            self.recommended.append(rec)
            if self.rank == 0:
                log.info(f"  SLOW NODE: re-plan recommended at step {done_step} ({why}): {path} gives rank(s) "
                         f"{ranks} {rec['rows_after']} rows instead of {rec['rows_before']}; restart with "
                         f"--plan {path} "
                         f"(or run with --max-restarts >= 1 to re-plan automatically); training goes on")
            return
        t0 = time.perf_counter()
        saver.save(done_step, final=True)  # synchronous: complete before any rank leaves
        rec.update({"action": "restart", "restarts_left": left, "restart_s": None,
                    "checkpoint_s": time.perf_counter() - t0})
        if self.rank == 0:
            self.elastic.replanning(rec)  # elastic.json: state "replan", the record the next job completes
            log.info(f"  SLOW NODE: re-planning at step {done_step}: rank(s) {ranks} weighted down "
                     f"({rec['rows_before']} -> {rec['rows_after']} rows); checkpoint written, {path}; every rank "
                     f"exits with code {EXIT_REPLAN} and torchrun restarts the job on the new plan "
                     f"({left} restart(s) left)")
        dist.barrier(group=self.book)  # rank 0's files are written before any rank exits
        raise ReplanRequested(f"rank {self.rank}: re-plan at step {done_step} for slow rank(s) {ranks}: "
                              f"restart on {path}")


def plan_rows(plan, world: int) -> list[int]:
    """Rows per step of every rank under `plan` (summary.json)."""
    return [rank_rows(plan, r) for r in range(world)]
