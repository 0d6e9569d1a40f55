"""Faults and restarts of a `hal train` run: what a failing rank records, and the recovery accounting of
the restarted job (time to recover, steps lost); `Elastic` is the trainer's fault-handling component.

How a fault ends (docs/training.md, "Faults and elasticity"): a rank that dies or freezes makes every
other rank's next collective with it fail within the group's bound with a typed error: the bridge's
(hal.ccl_bridge.errors.BridgePeerError for a dead peer, BridgeTimeoutError for a frozen one, after
`timeout_s` + HAL_BRIDGE_GRACE_S) or, in a group inside one chip kind, that chip's CCL's
(hal.emulation.shm's); both are hal.contract.errors.CollectivePeerError / CollectiveTimeoutError. Each
failing rank writes one record and exits at once (hal.trainer.loop.exit_failed: os._exit, so no
interpreter clean-up waits on a broken group), torchrun (`hal train --max-restarts N`) stops the rest and
starts the job again, and the new job resumes from the newest complete checkpoint. Steps since it are lost.
A relaunch on a different cluster (a node removed or replaced) resumes the same way; with `plan.source =
"auto"` (`--plan auto`) the planner lays the model out for the ranks that are there, and the checkpoint
reshards (hal.trainer.checkpoint).

Run state, `<run dir>/elastic.json` (rank 0): `state` "running" while a job runs, "finished" at a clean end;
a job that starts and finds "running" knows the previous one failed. It keeps `restarts`, one entry per
recovery: the last step the failed job completed (`failed_at_step`), the checkpoint step resumed from, the
steps lost, the first error seen (`error`), world and chips before and after, whether the plan changed,
`restart_s` (failure -> first step completed again) and `recovered_s` (failure -> back at the step reached).
The failure time is the earliest failure record of the failed job, else its last metrics record.

Faults are injected for tests by the `[debug]` section (hal.trainer.debug), which records them here.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Optional

STATE = "elastic.json"
log = logging.getLogger(__name__)


_JOB: Optional[int] = None  # this job's number, agreed by every node in init_process_group


def attempt() -> int:
    """This job's number in the run: once the process group is up, the one every node agreed on
    (init_process_group: a node whose `hal train` was started again joins the others' job), before it
    torchrun's restart count (0 for the first start, and outside torchrun)."""
    if _JOB is not None:
        return _JOB
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    except ValueError:
        return 0


def under_torchrun() -> bool:
    return bool(os.environ.get("TORCHELASTIC_RUN_ID"))


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


class Elastic:
    """One rank's view: records its failure, and (rank 0) accounts for the recovery of a restarted job."""

    def __init__(self, run_dir: Path, rank: int, world: int) -> None:
        self.run_dir, self.rank, self.world = run_dir, rank, world
        self.attempt = attempt()
        self.pending: Optional[dict] = None  # rank 0: the recovery being measured
        self.pending_replan: Optional[dict] = None  # rank 0: the mid-run re-plan being completed (hal.trainer.replan)
        self.state: dict = {}

    # ---- start (rank 0) --------------------------------------------------------------------------
    def start(self, resumed_step: int, chips: list, plan_json: str, resharded: bool) -> Optional[dict]:
        """Rank 0, after the resume: mark the run running; when the previous job failed, open the
        recovery record (returned, also logged) that `step_done` completes."""
        path = self.run_dir / STATE
        self.state = _read_json(path) or {"restarts": []}
        kinds = ",".join(f"{c['chip']}" for c in chips)
        if self.state.get("state") == "replan" and self.state.get("replans"):
            # the previous job left on purpose for a slow-node re-plan (hal.trainer.replan): not a failure
            rp = self.state["replans"][-1]
            rp.update({"attempt": self.attempt, "resumed_from_step": resumed_step,
                       "steps_lost": max(0, rp["step"] - resumed_step), "applied": self.state.get("job", {}).get(
                           "plan") != plan_json, "resharded": resharded})
            self.pending_replan = rp
            log.info(f"hal train: restarted for the re-plan of step {rp['step']} (slow rank(s) {rp['ranks']}): "
                     f"resumed from step {resumed_step}"
                     + ("; on the new plan" if rp["applied"] else "; the new plan was NOT applied (see above)"))
        elif self.state.get("state") == "running":
            prev = self.state.get("job", {})
            reached, last_t = _last_metrics(self.run_dir / "metrics.jsonl", prev.get("started", 0.0))
            errors = _failure_records(self.run_dir, prev.get("started", 0.0))
            failed_t = min((e["time"] for e in errors), default=last_t or prev.get("started", time.time()))
            reached = max(reached, resumed_step)
            first = errors[0] if errors else {}
            self.pending = {
                "attempt": self.attempt, "failed_at_step": reached, "resumed_from_step": resumed_step,
                "steps_lost": reached - resumed_step, "failed_time": failed_t,
                "error": (f"rank {first['rank']}: {first['error']}" if first else "no record (a rank was killed)"),
                "failure_records": len(errors),
                "world_before": prev.get("world"), "world_after": self.world,
                "chips_before": prev.get("chips"), "chips_after": kinds,
                "replanned": prev.get("plan") != plan_json, "resharded": resharded,
                "restart_s": None, "recovered_s": None}
            log.info(f"hal train: restarted after a failure in step {reached + 1} ({self.pending['error']}): resumed "
                     f"from step {resumed_step}, {reached - resumed_step} step(s) lost; world "
                     f"{prev.get('world')} -> {self.world}"
                     + (f", chips {prev.get('chips')} -> {kinds}" if prev.get("chips") != kinds else "")
                     + ("; re-planned for this cluster" if self.pending["replanned"] else ""))
        self.state.update({"state": "running", "job": {"attempt": self.attempt, "started": time.time(),
                                                        "world": self.world, "chips": kinds, "plan": plan_json}})
        self._write()
        return self.pending

    def step_done(self, done: int) -> dict:
        """Rank 0, after each step: the metrics keys of recovery (`attempt` always; `restart` on the step
        a recovery completes)."""
        keys: dict = {"attempt": self.attempt}
        rp = self.pending_replan
        if rp is not None:
            rp["restart_s"] = time.time() - rp["decided_time"]
            self.pending_replan = None
            self._write()
            keys["replan"] = rp
            log.info(f"hal train: re-planned: {rp['restart_s']:.1f} s from the decision at step {rp['step']} to step "
                     f"{done} done on the new plan (checkpoint, restart, resume; one step of work included), "
                     f"{rp['steps_lost']} step(s) lost")
        p = self.pending
        if p is None:
            return keys
        now = time.time()
        if p["restart_s"] is None:
            p["restart_s"] = now - p["failed_time"]
        if done >= p["failed_at_step"] and p["recovered_s"] is None:
            p["recovered_s"] = now - p["failed_time"]
            self.state.setdefault("restarts", []).append(p)
            self.pending = None
            self._write()
            keys["restart"] = p
            log.info(f"hal train: recovered: {p['restart_s']:.1f} s from the failure to the first step done again "
                     f"(step {p['resumed_from_step'] + 1}), {p['recovered_s']:.1f} s to step {done} "
                     f"({p['steps_lost']} step(s) lost and redone)")
        return keys

    def finish(self) -> dict:
        """Rank 0, at a clean end: the summary keys (restarts so far, steps lost, recovery times)."""
        if self.pending is not None:  # ended before reaching the failed step (stop_after)
            self.state.setdefault("restarts", []).append(self.pending)
            self.pending = None
        self.state["state"] = "finished"
        self._write()
        r = self.state.get("restarts", [])
        return {"restarts": r, "steps_lost": sum(x["steps_lost"] for x in r),
                "recover_s": [x["recovered_s"] for x in r], "attempt": self.attempt,
                "replans": self.state.get("replans", [])}

    def replanning(self, rec: dict) -> None:
        """Rank 0, before the ranks leave for a mid-run re-plan (hal.trainer.replan): state "replan" and the
        record, which the restarted job completes (`start`, `step_done`)."""
        self.state.setdefault("replans", []).append(rec)
        self.state["state"] = "replan"
        self._write()

    def _write(self) -> None:
        path = self.run_dir / STATE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=1) + "\n")
        tmp.replace(path)

    # ---- every rank ------------------------------------------------------------------------------
    def failed(self, step: int, exc: BaseException, step_s: Optional[float]) -> None:
        """Record this rank's failure (typed error, step, how long it waited) and log one line."""
        err = f"{type(exc).__name__}: {exc}".splitlines()[0][:400]
        self.record({"step": step, "error": err, "error_type": type(exc).__name__, "step_s": step_s})
        print(f"hal train: rank {self.rank} failed in step {step}"
              + (f" after {step_s:.1f} s" if step_s is not None else "") + f": {err}", file=sys.stderr, flush=True)

    def record(self, rec: dict) -> None:
        """Write one failure record of this rank (`faults/attempt<A>-rank<R>-<ns>.json`), atomically: a rank
        killed while writing (torchrun stops the others once one fails) leaves a temporary file, never an
        empty or half-written record for the job's accounting (or a reader) to trip on."""
        d = self.run_dir / "faults"
        d.mkdir(parents=True, exist_ok=True)
        rec = {"rank": self.rank, "attempt": self.attempt, "time": time.time(), **rec}
        path = d / f"attempt{self.attempt}-rank{self.rank}-{time.time_ns()}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(rec) + "\n")
        tmp.replace(path)


def _last_metrics(path: Path, since: float) -> tuple[int, Optional[float]]:
    """(highest step, time of the last record) among metrics records written after `since`."""
    step, t = 0, None
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return 0, None
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        rt = rec.get("time")
        if "step" in rec and rt is not None and rt >= since:
            step, t = max(step, int(rec["step"])), rt
    return step, t


def _failure_records(run_dir: Path, since: float) -> list[dict]:
    out = [_read_json(p) for p in sorted((run_dir / "faults").glob("*.json"))] if (run_dir / "faults").is_dir() else []
    return sorted((r for r in out if r.get("time", 0) >= since), key=lambda r: r["time"])


def init_process_group(backend: str, timeout) -> None:
    """`dist.init_process_group`, with the store of a torchrun job under a prefix of its restart count.

    torchrun's static rendezvous (one node, --master-addr/--master-port) keeps ONE agent TCPStore across
    restarts (torch 2.13 static_tcp_rendezvous.py: `if not self._store` creates it once), while the
    workers' env:// rendezvous assumes a fresh store per retry (rendezvous.py, _create_c10d_store: "We
    create a new TCPStore for every retry so no need to add prefix for each attempt"). The restarted
    workers then read the failed job's keys - gloo peer addresses of dead processes - and group creation
    fails ("connectFullMesh ... Connection refused"). A prefix per job keeps each job's keys apart.

    The job's number is max(torchrun's restart count, how often this global rank joined before) (a
    counter in the agents' store, which node 0's torchrun keeps): the nodes' restart counts agree when
    every torchrun restarts its ranks, and the join count makes a node whose `hal train` was killed and
    started again (restart count 0) join the job the surviving nodes restarted into."""
    import torch.distributed as dist
    global _JOB
    env = os.environ
    if under_torchrun() and env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), world, is_master=False, timeout=timeout)
        _JOB = max(attempt(), store.add(f"hal_train/joins/rank_{rank}", 1) - 1)
        store = dist.PrefixStore(f"hal_train/attempt_{_JOB}", store)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    else:
        dist.init_process_group(backend, timeout=timeout)


def live_topology(world: int, group):
    """The topology of the ranks that are here: the environment's (HAL_EMULATE / HAL_CLUSTER) when it
    names the chip every rank actually runs, else one built from the ranks' own chips (gathered over
    `group`, collective). After a node is removed or replaced the environment may still describe the old
    cluster - a spec of the old world size, or a per-node HAL_EMULATE=<chip> that names one chip for
    every rank - and the plan (`auto`) must be made for what is there. From the chips alone each chip
    kind is one sub-cluster on one node with the catalog's link figures (hal.core.topology.Topology.from_chips)."""
    import torch.distributed as dist

    import hal
    from hal.core.topology import Topology, TopologyError
    acc = hal.accelerator()
    live: list = [None] * world
    dist.all_gather_object(live, (acc.chip.name, bool(acc.emulated)), group=group)
    chips = [c for c, _ in live]
    try:
        topo = Topology.from_env(world_size=world)
        named = [topo.chip_of(r) for r in range(world)]
        if named == chips:
            return topo
        why = f"the environment names chips {named}, the ranks run {chips}"
    except TopologyError as exc:
        why = f"the environment gives no topology for {world} ranks: {exc}"
    if dist.get_rank() == 0:
        log.info(f"hal train: topology from the ranks' own chips ({why})")
    return Topology.from_chips(chips, emulated=all(e for _, e in live))
