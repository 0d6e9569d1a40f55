"""`Trainer`: one rank's `hal train` run, shaped like torchtitan's Trainer.

    trainer = Trainer(cfg)        # collective: every rank of the world builds it
    result = trainer.train()      # train (or resume) to cfg.last_step; closes the trainer
    trainer.close()               # idempotent; train() already calls it

`__init__` joins the process group, gathers the chips that are here (hal.trainer.elastic.live_topology),
builds the Plan (`even`, a file, or `auto` = the planner's search on rank 0, broadcast), the model
(hal.strategies.models) from the same seed on every rank, lays it out with
hal.strategies.apply.apply_plan, and builds torch's AdamW, the corpus and its loader (hal.trainer.data) and
the components the run is made of:

  checkpointer  hal.trainer.checkpoint.Checkpointer - DCP saves every `checkpoint.interval` steps and at
                the end; a start resumes from the newest complete checkpoint (resharding when the plan or
                world changed)
  metrics       hal.trainer.metrics.RunMetrics - every rank's step timings, metrics.jsonl, the progress
                display and the slow-node detector
  elastic       hal.trainer.elastic.Elastic - failure records and the recovery accounting of a restart
  links         hal.trainer.link_watch.SlowLinkCheck - link issue time and the slow-link check
  replan        hal.trainer.replan.MidRunReplan - the mid-run re-plan on a confirmed slow node
  faults        hal.trainer.debug.FaultInjector - the test-only `[debug]` section (does nothing without it)

`train_step(step)` runs one optimizer step: lr from the schedule, this step's global batch, forward and
backward of this rank's share (`run.step` returns the global mean loss), the global gradient norm,
AdamW; it returns the step's metrics record. `train()` drives the steps and the components around them,
validation, the final checkpoint, and (rank 0, unless `report=False`) summary.json and the closing report
(hal.trainer.report).

Bookkeeping (step times, checkpoint coordination, the auto plan's broadcast) runs on one extra gloo group;
the training collectives on the plan's groups over the configured backend (`hetero`: ccl_bridge).
Validation runs `run.step` on fixed held-out batches and drops the gradients (apply_plan has no
forward-only path), so it costs a backward too.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist

from .config import TrainConfig, TrainConfigError
from .data import Loader, load_corpus, load_position, read_rows, replica_rows, save_position, val_batches

log = logging.getLogger(__name__)


# ---- set-up helpers ------------------------------------------------------------------------------
def init_distributed(cfg: TrainConfig) -> None:
    """Join the default process group on the configured backend (once per process)."""
    if cfg.backend == "hetero":
        import hal.ccl_bridge  # noqa: F401 - registers the `hetero` backend
    if not dist.is_initialized():
        from .elastic import init_process_group  # a restarted job's store keys apart from the failed one's
        init_process_group(cfg.backend, timedelta(seconds=cfg.timeout_s))


def _plan_from_config(cfg: TrainConfig, topo, model_cfg, group):
    from hal.strategies.plan import Plan
    p = cfg.plan
    if p.source == "even":
        return Plan.even(topo, model_cfg, cfg.global_batch, p.num_microbatches, pp=p.pp, tp=p.tp, zero=p.zero,
                         ep=p.ep)
    if p.source == "file":
        path = cfg.resolve(p.file)
        if not path.is_file():
            raise TrainConfigError("plan.file", p.file, f"no such file ({path})")
        return Plan.load(path)
    from .autoplan import auto_plan, probe_link, timed_on
    if group is None:  # before launch (hal/cli/train.py): no ranks to probe or to broadcast to
        return auto_plan(cfg, topo, model_cfg, None)
    link = probe_link(group) if timed_on() else None  # timed emulation: this host's links, measured
    box: list[Any] = [None]
    if dist.get_rank() == 0:
        box[0] = auto_plan(cfg, topo, model_cfg, link).to_json()
    dist.broadcast_object_list(box, src=0, group=group)
    return Plan.from_json(box[0])


def make_plan(cfg: TrainConfig, topo, model_cfg, group):
    """The Plan the config asks for, the same on every rank (auto: searched on rank 0, broadcast on
    `group`), checked against the cluster, the model and the global batch."""
    plan = _plan_from_config(cfg, topo, model_cfg, group)
    plan.check(topo, model_cfg)
    if model_cfg.is_moe and plan.zero == 0 and any(st.dp > 1 and st.experts is None for st in plan.stages):
        # DDP over a MoE stage without expert placement hangs in its first gradient all_reduce (torch
        # 2.13, emulated 2+2): refuse it up front rather than wait for timeout_s
        raise TrainConfigError("plan.ep", cfg.plan.ep,
                               f"MoE model {model_cfg.name!r} ({model_cfg.experts} experts) with data parallel "
                               f"and no expert placement is not supported; set plan.ep = true (or plan.source = auto)")
    if plan.global_batch != cfg.global_batch:
        raise TrainConfigError("global_batch", cfg.global_batch,
                               f"the plan runs {plan.num_microbatches} micro-batches x {plan.microbatch_size} "
                               f"rows = {plan.global_batch}")
    from .memory_fit import check_fits  # every plan source, before launch and on the ranks
    check_fits(plan, topo, model_cfg, cfg.plan.source, cfg.train.precision)
    return plan


def build_optimizer(cfg: TrainConfig, params: list) -> Optional[torch.optim.Optimizer]:
    """torch AdamW over this rank's parameters (None for a rank that holds none)."""
    o = cfg.optimizer
    if not params:
        return None
    return torch.optim.AdamW(params, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay,
                             foreach=False)


def params_digest(params: dict[str, torch.Tensor]) -> str:
    """SHA-256 over the parameters' names and float32 bytes (bitwise repeat and resume checks)."""
    h = hashlib.sha256()
    for name in sorted(params):
        h.update(name.encode())
        h.update(params[name].detach().contiguous().float().numpy().tobytes())
    return h.hexdigest()


# ---- the trainer ---------------------------------------------------------------------------------
class Trainer:
    """One rank's training run (module doc). Every rank of the world builds it and calls `train()`."""

    def __init__(self, cfg: TrainConfig, *, report: bool = True, digest: bool = False) -> None:
        import hal
        self.cfg, self.report, self.want_digest = cfg, report, digest
        init_distributed(cfg)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.accelerator = hal.accelerator()
        self.book = dist.new_group(backend="gloo", timeout=timedelta(seconds=cfg.timeout_s))  # bookkeeping
        if cfg.checkpoint.enabled:  # several nodes: every node sees rank 0's checkpoint folder (bounded wait)
            from hal.launch.nodes import check_shared_dir
            check_shared_dir(cfg.checkpoint_dir, self.book, min(60.0, cfg.timeout_s))
        self._build_layout()
        self._build_model()
        self.corpus = load_corpus(cfg, self.rank, self.book)  # tokenised once (rank 0, cached), read by every rank
        rows = read_rows(self.plan, self.rank)  # the rows of each global batch this rank reads (hal.trainer.data)
        self.loader = Loader(self.corpus, cfg.seed, cfg.global_batch, self.model_cfg.seq, rows)
        self.val_data = val_batches(self.corpus, cfg.seed, cfg.log.val_batches, cfg.global_batch, self.model_cfg.seq,
                                    rows)
        self.losses: list[float] = []
        self.val_history: list[tuple[int, float]] = []
        self._step_t0: Optional[float] = None
        self._closed = False
        self._build_components()
        self.end, self.final_val_loss, self.digest, self.train_s = self.start, float("nan"), "", 0.0

    # ---- __init__'s parts ------------------------------------------------------------------------
    def _build_layout(self) -> None:
        """Topology of the ranks that are here, the model config and the Plan (a mid-run re-plan's
        replan.json when this run made one), and every rank's chip and rows."""
        from .elastic import live_topology
        cfg = self.cfg
        self.topology = live_topology(self.world, self.book)
        self.model_cfg = cfg.load_model_config()  # vocab = 256 checked there
        self.plan = make_plan(cfg, self.topology, self.model_cfg, self.book)
        self.weighted: set = set()  # ranks a mid-run re-plan of this run weighted down
        if cfg.slow_node.replan:
            from .replan import choose_plan
            self.plan, self.weighted = choose_plan(cfg, self.plan, self.topology, self.model_cfg, self.book)
        acc = self.accelerator
        from hal.strategies.precision import Precision, resolve_dtype
        dtype = resolve_dtype(cfg.train.precision, acc.profile, self.rank, acc.chip.name)
        chips: list = [None] * self.world
        dist.all_gather_object(chips, {"rank": self.rank, "chip": acc.chip.name, "emulated": bool(acc.emulated),
                                       "plugin": acc.plugin, "rows": replica_rows(self.plan, self.rank),
                                       "dtype": dtype}, group=self.book)
        self.chips = chips
        self.precision = Precision([c["dtype"] for c in chips], self.rank)

    def _build_model(self) -> None:
        """Build on meta -> apply_plan (this rank's stages, TP shards, experts) -> materialise them
        (`materialize_weights`, the hook: init from the seed) -> `[model] hf` weights replace the init."""
        from hal.strategies.apply import apply_plan
        from hal.strategies.models import build_model
        from hal.strategies.precision import LossScaler
        torch.manual_seed(self.cfg.seed)
        self.model = build_model(self.model_cfg, self.cfg.seed, device="meta")  # no storage: no rank holds it all
        self.run = apply_plan(self.model, self.plan, self.topology, model_cfg=self.model_cfg,
                              timeout=timedelta(seconds=self.cfg.timeout_s), materialize=self.materialize_weights,
                              precision=self.precision)
        self.scaler = LossScaler() if self.precision.loss_scaling else None  # float16 somewhere: one world scale
        self.hf_loaded = None
        if self.cfg.model.hf is not None:  # [model] hf: its weights replace the init, this rank's tensors only
            from hal.strategies.models.hf_io import load_hf_weights
            self.hf_loaded = load_hf_weights(self.run.modules, self.model_cfg, self.cfg.resolve(self.cfg.model.hf),
                                             self.rank)
        self.params = self.run.parameters()
        self.optimizer = build_optimizer(self.cfg, self.params)

    def materialize_weights(self, stage: torch.nn.Module) -> None:
        """apply_plan's materialize hook: allocate this rank's meta parameters of one stage (its TP/FSDP2
        shards, its experts) and fill them with their init values (a function of seed, name, shape)."""
        from hal.strategies.models.init import materialize
        materialize(stage, self.cfg.seed)

    def _build_components(self) -> None:
        from .checkpoint import Checkpointer
        from .debug import FaultInjector
        from .elastic import Elastic
        from .link_watch import SlowLinkCheck
        from .metrics import RunMetrics
        from .replan import MidRunReplan
        cfg = self.cfg
        if self.rank == 0:
            cfg.run_dir.mkdir(parents=True, exist_ok=True)
            from hal.strategies.models.hf_io import write_run_record  # model.json: what `hal export` maps
            write_run_record(cfg.run_dir, self.model_cfg, cfg.checkpoint_dir, cfg.resolve(cfg.model.hf))
        dist.barrier(group=self.book)
        self.elastic = Elastic(cfg.run_dir, self.rank, self.world)
        self.faults = FaultInjector(cfg.debug, self.rank, self.elastic.attempt, cfg.backend, self.elastic.record)
        from .nonfinite import NonFiniteGuard, named_parameters
        self.nonfinite, self.named_params = NonFiniteGuard(cfg.train, self.rank, self.book), named_parameters(self.run)
        self.checkpointer = Checkpointer(cfg.checkpoint_dir, self.run, self.optimizer, self.plan, self.chips,
                                         cfg.timeout_s, cfg.checkpoint.async_save,
                                         self.elastic.attempt) if cfg.checkpoint.enabled else None
        self.resumed = self.checkpointer.resume() if self.checkpointer is not None and cfg.checkpoint.resume else None
        self.start = self.resumed.step if self.resumed is not None else 0
        if self.resumed is not None:  # continue on the next unseen sequence (its tokenizer and seq checked)
            position = load_position(self.resumed.path)
            self.loader.resume(position, self.start)
            if self.scaler is not None and position and "loss_scaler" in position:  # the float16 loss scale too
                self.scaler.load_state_dict(position["loss_scaler"])
        if self.rank == 0:
            self.elastic.start(self.start, self.chips, self.plan.to_json(indent=None),
                               bool(self.resumed and self.resumed.resharded))
            self._log_start()
        self.metrics = RunMetrics(cfg, self.plan, self.model_cfg, self.run, self.chips, self.book, self.accelerator,
                                  self.start, throttle=self.faults.throttle)
        self.links = SlowLinkCheck(cfg, [c["chip"] for c in self.chips], cfg.backend, self.book,
                                   self.faults.link_delay_s, self.faults.link_delays)
        self.replan = MidRunReplan(cfg, self.plan, self.rank, self.elastic, self.book, self.weighted)

    def _log_start(self) -> None:
        from .checkpoint import step_dir
        cfg, corpus, r = self.cfg, self.corpus, self.resumed
        chips = ", ".join(c["chip"] + (" (emulated)" if c["emulated"] else "") for c in self.chips)
        log.info(f"hal train: {self.world} ranks ({chips}); model {self.model_cfg.name} "
                 f"{sum(p.numel() for p in self.model.parameters()):,} parameters; "
                 f"plan {cfg.plan.source + (' re-planned (replan.json)' if self.weighted else '')}: "
                 f"{self.plan.describe() if hasattr(self.plan, 'describe') else self.plan}")
        log.info(f"  data: {corpus.source}: {corpus.files} files, tokenizer {corpus.tokenizer.name} (vocab "
                 f"{corpus.vocab_size}), train {corpus.train.numel():,} tokens, validation {corpus.val.numel():,}; "
                 f"global batch {cfg.global_batch} x {self.model_cfg.seq} tokens, {self.loader.windows:,} per epoch")
        if self.hf_loaded is not None:  # each rank read only its own tensors (hf_io logs every rank's at debug)
            log.info(f"  weights: HF checkpoint {cfg.resolve(cfg.model.hf)}; rank 0 read {self.hf_loaded.describe()}")
        if r is not None:
            log.info(f"  resumed from {step_dir(cfg.checkpoint_dir, r.step)} at step {r.step} in {r.load_s:.1f} s"
                     + (f" (resharded: written by {r.saved_world} ranks on another plan)" if r.resharded else ""))

    # ---- one step --------------------------------------------------------------------------------
    def train_step(self, step: int) -> dict:
        """One optimizer step of 0-based `step` (every rank): the schedule's lr, the step's global batch,
        forward and backward of this rank's share, the global gradient norm, AdamW. Returns the step's
        metrics record (every rank's timings; complete on rank 0)."""
        from .metrics import global_grad_norm
        cfg = self.cfg
        lr = cfg.lr_at(step)
        if self.optimizer is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        inputs, targets = self.loader.batch(step)  # this rank's rows of the step's global batch
        self._step_t0 = time.perf_counter()
        self.links.begin()
        self.metrics.begin()
        if self.scaler is not None:
            self.run.set_loss_scale(self.scaler.scale)
        loss = float(self.run.step(inputs, targets))
        self.faults.after_backward(step + 1, self.named_params)  # test-only [debug] nan_grad
        stepped = self.scaler is None or self.scaler.step(self.params, self.book, cfg.timeout_s, step + 1)
        grad_norm = global_grad_norm(self.run, self.plan, self.rank, self.book)
        # a non-finite loss, gradient or grad norm: stop, or skip on every rank (hal.trainer.nonfinite); a
        # float16 overflow the scaler skipped (stepped False, agreed by every rank) is not one
        skip = stepped and self.nonfinite.check(step + 1, loss, grad_norm, self.named_params)
        if self.optimizer is not None:
            if stepped and not skip:  # stepped False: a float16 overflow somewhere, every rank skips (LossScaler)
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.losses.append(loss)
        record = self.metrics.end(step + 1, loss, lr, grad_norm, self.links.issue_s())
        if self.scaler is not None:
            record.update(loss_scale=self.scaler.scale, amp_skipped=int(not stepped))
        if self.nonfinite.skipped:
            record["nonfinite_skipped"] = self.nonfinite.skipped
        return record

    def _after_step(self, record: dict) -> None:
        """The components' turn after a step: slow links, recovery accounting, validation, the record,
        the periodic checkpoint, and the mid-run re-plan (which may end the job: ReplanRequested)."""
        cfg, done = self.cfg, record["step"]
        self.links.after_step(record)
        if self.rank == 0:
            record.update(self.elastic.step_done(done))  # attempt; restart (time to recover) once recovered
        if cfg.log.val_interval and done % cfg.log.val_interval == 0 and done != cfg.last_step:
            record["val_loss"] = self.evaluate()
            self.val_history.append((done, record["val_loss"]))
        self.metrics.write(record)  # rank 0: metrics.jsonl and the progress display
        if (self.checkpointer is not None and cfg.checkpoint.interval and done % cfg.checkpoint.interval == 0
                and done != cfg.last_step):
            self._save_position(done)
            self.checkpointer.save(done)  # asynchronous: returns once the state is copied
        self.replan.after_step(done, self.metrics.detector, self.checkpointer, self.metrics.records)

    def _save_position(self, step: int) -> None:
        """Rank 0: the data loader's position after `step` steps into that step's checkpoint folder."""
        if self.rank == 0:
            from .checkpoint import step_dir
            state = self.loader.state(step)
            if self.scaler is not None:  # one world scale (every rank agrees each step): rank 0's is the world's
                state["loss_scaler"] = self.scaler.state_dict()
            save_position(step_dir(self.cfg.checkpoint_dir, step), state)

    def evaluate(self) -> float:
        """Mean loss over the held-out batches (the gradients the steps leave are dropped)."""
        total = 0.0
        for inputs, targets in self.val_data:
            total += float(self.run.step(inputs, targets))
            for p in self.params:
                p.grad = None
        return total / len(self.val_data)

    # ---- the run ---------------------------------------------------------------------------------
    def train(self) -> dict:
        """Train from the resumed step to `cfg.last_step`, then validate, checkpoint and (rank 0) report.
        Returns this rank's result: rank, chip, start/end step, losses, validation losses, params digest
        ("" unless the Trainer was built with `digest=True`)."""
        from .replan import ReplanRequested
        t_run = time.perf_counter()
        step = self.start
        try:
            for step in range(self.start, self.cfg.last_step):
                self._step_t0 = None
                self.faults.before_step(step + 1)  # test-only ([debug] faults)
                self._after_step(self.train_step(step))
            self._step_t0 = None
            self._finish_training()
        except BaseException as exc:
            if isinstance(exc, ReplanRequested):  # a re-plan is no failure (hal/trainer/replan.py)
                raise
            step_s = None if self._step_t0 is None else time.perf_counter() - self._step_t0
            typed = _peer_lost(exc, self.rank, step + 1)
            self.elastic.failed(step + 1, typed or exc, step_s)
            if typed is not None:
                raise typed from exc
            raise
        finally:
            self.close()
        self.train_s = time.perf_counter() - t_run
        summary = self.summary()
        if self.rank == 0 and self.report:
            from .report import write_report
            write_report(self.cfg, self.plan, summary, self.links.detector)
        return {"rank": self.rank, "chip": self.accelerator.chip.name, "start": self.start, "end": self.end,
                "losses": self.losses, "val": self.val_history, "final_val_loss": self.final_val_loss,
                "digest": self.digest, "resumed": summary["resumed"]}

    def _finish_training(self) -> None:
        """Final validation and checkpoint (synchronous), and the parameters' digest (when asked)."""
        self.end = max(self.start, self.cfg.last_step)
        self.final_val_loss = self.evaluate()
        self.val_history.append((self.end, self.final_val_loss))
        self.metrics.write_sinks(self.end, {"val_loss": self.final_val_loss})  # rank 0: TensorBoard etc.
        if self.checkpointer is not None:
            if self.end > self.start:
                self._save_position(self.end)
                self.checkpointer.save(self.end, final=True)
            self.checkpointer.close()
            cfg = self.cfg
            if cfg.checkpoint.export_hf:  # rank 0: the final checkpoint as a HF one (hal export's route)
                from hal.strategies.models.hf_io import export_checkpoint

                from .checkpoint import latest, step_dir
                if self.rank == 0:
                    export_checkpoint(step_dir(cfg.checkpoint_dir, latest(cfg.checkpoint_dir)), self.model_cfg,
                                      cfg.resolve(cfg.checkpoint.export_hf), copy_from=cfg.resolve(cfg.model.hf))
                dist.barrier(group=self.book)
        # the digest (bitwise repeat and resume checks) gathers this rank's stages to full tensors (FSDP/TP):
        # only when asked (`digest=True`), never for a `hal train` job, whose stage may not fit unsharded
        if self.want_digest and self.run.active:
            self.digest = params_digest(self.run.full_parameters())

    def summary(self) -> dict:
        """The run's summary.json content (the per-step figures, recovery and slow-node findings on rank 0)."""
        from .replan import plan_rows
        r = self.resumed
        summary: dict[str, Any] = {
            "final_val_loss": self.final_val_loss, "uniform_baseline": math.log(self.corpus.vocab_size),
            "start_step": self.start,
            "end_step": self.end, "steps": self.cfg.steps, "train_s": self.train_s, "world": self.world,
            "backend": self.cfg.backend, "plan_source": self.cfg.plan.source, "plan": json.loads(self.plan.to_json()),
            "val_losses": self.val_history, "chips": self.chips,
            "checkpoints": self.checkpointer.saved if self.checkpointer is not None else [],
            "resumed": None if r is None else {"step": r.step, "resharded": r.resharded,
                                               "saved_world": r.saved_world, "load_s": r.load_s,
                                               "skipped": r.skipped},
            "nonfinite_skipped": self.nonfinite.skipped}
        if self.rank != 0:
            return summary
        summary.update(self.elastic.finish())  # restarts: steps lost, time to recover
        summary.update(self.metrics.summary())  # medians, MFU per chip kind, slow nodes
        for rec in summary.get("replans") or []:  # the job that ran on a re-plan: its tokens/s after it
            if rec.get("attempt") == self.elastic.attempt:
                rec["tokens_per_s_after"] = summary.get("tokens_per_s_median")
        summary.update(self.links.summary())
        summary.update({"replan_recommended": self.replan.recommended, "rank_rows": plan_rows(self.plan, self.world)})
        return summary

    def close(self) -> None:
        """Stop the display, close metrics.jsonl and the link watch (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.metrics.close()
        self.links.close()


def _peer_lost(exc: BaseException, rank: int, step: int) -> Optional[BaseException]:
    """A raw gloo transport error from one of the trainer's plain gloo groups (the bookkeeping group: step
    times, grad norm, agreements) when a peer died, as the typed CollectivePeerError naming rank and step
    (the bridge and the CPU fabrics type theirs already); None for anything else."""
    text = str(exc)
    if type(exc) is RuntimeError and "gloo" in text and ("Connection reset" in text or "Connection closed" in text):
        from hal.contract.errors import CollectivePeerError
        first = text.splitlines()[0] if text else ""
        return CollectivePeerError(f"rank {rank}, step {step}: a peer of a gloo group is gone: {first}")
    return None

