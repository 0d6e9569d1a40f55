"""The `hal train` loop, run on every rank under torchrun (`hal train` launches it):

    HAL_EMULATE=cuda:2,ascend:2 torchrun --nproc-per-node 4 -m hal.trainer.loop --config examples/train/tiny.toml

Builds the model (hal.strategies.models) on every rank from the same seed, the Plan (`even`, a file, or
`auto` = the planner's search at start, run on rank 0 and broadcast), lays the model out with
`hal.strategies.apply.apply_plan`, and trains with torch's AdamW on the byte-level corpus (hal.trainer.data):
each step every rank draws the same global batch, `run.step` runs this rank's rows of it and returns
the global mean loss. Rank 0 writes `metrics.jsonl` (one record per step: step, loss, lr, tokens/s,
each rank's step time; validation records with `val_loss`) and `summary.json` (final_val_loss, the
chip of every rank, emulated or not) in the run directory. Checkpoints (hal.trainer.checkpoint, DCP)
every `checkpoint.interval` steps and at the end; a start with a complete checkpoint in the
directory resumes from the newest one.

Bookkeeping (step times, checkpoint coordination, the auto plan's broadcast) runs on one extra gloo
group; the training collectives run on the plan's groups over the configured backend (`hetero`:
ccl_bridge). Validation runs `run.step` on fixed held-out batches and throws the gradients away
(apply_plan has no forward-only path yet), so it costs a backward too.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from datetime import timedelta
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from .config import TrainConfig, TrainConfigError
from .data import VOCAB, Corpus, replica_rows, train_batch, val_batches
from .elastic import Elastic, live_topology
from .metrics import global_grad_norm
from .report import end_report, finish_report


def _init(cfg: TrainConfig) -> None:
    if cfg.backend == "hetero":
        import hal.ccl_bridge  # noqa: F401 - registers the `hetero` backend
    if not dist.is_initialized():
        from .elastic import init_process_group  # a restarted job's keys apart from the failed one's
        init_process_group(cfg.backend, timedelta(seconds=cfg.timeout_s))


def make_plan(cfg: TrainConfig, topo, model_cfg, group):
    """The Plan the config asks for, the same on every rank (auto: searched on rank 0, broadcast)."""
    from hal.strategies.plan import Plan
    p = cfg.plan
    if p.source == "even":
        plan = Plan.even(topo, model_cfg, cfg.global_batch, p.num_microbatches, pp=p.pp, tp=p.tp, zero=p.zero,
                          ep=p.ep)
    elif p.source == "file":
        path = cfg.resolve(p.file)
        if not path.is_file():
            raise TrainConfigError("plan.file", p.file, f"no such file ({path})")
        plan = Plan.load(path)
    else:
        from .autoplan import auto_plan, probe_link, timed_on
        link = probe_link(group) if timed_on() else None  # timed emulation: this host's links, measured
        box: list[Any] = [None]
        if dist.get_rank() == 0:
            box[0] = auto_plan(cfg, topo, model_cfg, link).to_json()
        dist.broadcast_object_list(box, src=0, group=group)
        plan = Plan.from_json(box[0])
    plan.check(topo, model_cfg)
    if model_cfg.is_moe and plan.zero == 0 and any(st.dp > 1 and st.experts is None for st in plan.stages):
        # seen here (torch 2.13, emulated 2+2): DDP over a MoE stage without EP timed out in its first
        # gradient all_reduce; refuse it up front rather than hang for timeout_s
        raise TrainConfigError("plan.ep", cfg.plan.ep,
                               f"MoE model {model_cfg.name!r} ({model_cfg.experts} experts) with data parallel "
                               f"and no expert placement is not supported; set plan.ep = true (or plan.source = auto)")
    if plan.global_batch != cfg.global_batch:
        raise TrainConfigError("global_batch", cfg.global_batch,
                               f"the plan runs {plan.num_microbatches} micro-batches x {plan.microbatch_size} "
                               f"rows = {plan.global_batch}")
    return plan


def _digest(params: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(params):
        h.update(name.encode())
        h.update(params[name].detach().contiguous().float().numpy().tobytes())
    return h.hexdigest()


def _evaluate(run, params, batches) -> float:
    total = 0.0
    for x, y in batches:
        total += float(run.step(x, y))
        for p in params:  # validation only: drop the gradients the step left
            p.grad = None
    return total / len(batches)


def train(cfg: TrainConfig, log: Callable[[str], None] = print) -> dict:
    """Run (or resume) the configured training on this rank; returns this rank's result (rank, chip,
    start/end step, losses, val losses, params digest). Every rank of the world must call it."""
    import hal
    from hal.strategies.apply import apply_plan
    from hal.strategies.models import build_model

    from . import checkpoint as ckpt

    _init(cfg)
    rank, world = dist.get_rank(), dist.get_world_size()
    acc = hal.accelerator()
    book = dist.new_group(backend="gloo", timeout=timedelta(seconds=cfg.timeout_s))  # bookkeeping
    topo = live_topology(world, book, log)  # the chips that are here (a node may have gone: hal/trainer/elastic.py)
    model_cfg = cfg.load_model_config()  # vocab = 256 checked there
    plan = make_plan(cfg, topo, model_cfg, book)
    weighted: set = set()
    if cfg.slow_node.replan:  # a run re-planned mid-run before goes on on <run dir>/replan.json (hal/trainer/replan.py)
        from .replan import choose_plan
        plan, weighted = choose_plan(cfg, plan, topo, model_cfg, book, log)
    chips: list = [None] * world
    dist.all_gather_object(chips, {"rank": rank, "chip": acc.chip.name, "emulated": bool(acc.emulated),
                                   "plugin": acc.plugin, "rows": replica_rows(plan, rank)}, group=book)
    torch.manual_seed(cfg.seed)
    model = build_model(model_cfg, cfg.seed)
    run = apply_plan(model, plan, topo, model_cfg=model_cfg, timeout=timedelta(seconds=cfg.timeout_s))
    params = run.parameters()
    o = cfg.optimizer
    opt = torch.optim.AdamW(params, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay,
                            foreach=False) if params else None
    corpus = Corpus.from_config(cfg)
    seq, G = model_cfg.seq, cfg.global_batch
    vals = val_batches(corpus, cfg.seed, cfg.log.val_batches, G, seq)
    run_dir, ckpt_dir = cfg.run_dir, cfg.checkpoint_dir
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
    dist.barrier(group=book)

    start = 0
    el = Elastic(run_dir, rank, world, cfg.backend, log)  # faults and restarts (hal/trainer/elastic.py)
    saver = ckpt.Checkpointer(ckpt_dir, run, opt, plan, chips, cfg.timeout_s, cfg.checkpoint.async_save,
                              el.attempt) if cfg.checkpoint.enabled else None
    resumed = saver.resume() if saver is not None and cfg.checkpoint.resume else None
    found = resumed.step if resumed is not None else None
    if resumed is not None:
        start = resumed.step
    if rank == 0:
        el.start(start, chips, plan.to_json(indent=None), bool(resumed and resumed.resharded))
    if rank == 0:
        log(f"hal train: {world} ranks ({', '.join(c['chip'] + (' (emulated)' if c['emulated'] else '') for c in chips)}); "
            f"model {model_cfg.name} {sum(p.numel() for p in model.parameters()):,} parameters; "
            f"plan {cfg.plan.source + (' re-planned (replan.json)' if weighted else '')}: "
            f"{plan.describe() if hasattr(plan, 'describe') else plan}")
        log(f"  data: {corpus.source}: {corpus.files} files, train {corpus.train.numel():,} B, "
            f"validation {corpus.val.numel():,} B; global batch {G} x {seq} bytes")
        if found is not None:
            log(f"  resumed from {ckpt.step_dir(ckpt_dir, found)} at step {start} in {resumed.load_s:.1f} s"
                + (f" (resharded: written by {resumed.saved_world} ranks on another plan)" if resumed.resharded else ""))
    from .metrics import RunMetrics  # per-step measurements, metrics.jsonl, display, slow nodes
    mon = RunMetrics(cfg, plan, model_cfg, run, chips, book, acc, start, log)
    from . import link_watch  # slow links: each rank's time submitting to its links (hal/trainer/link_watch.py)
    from .replan import MidRunReplan, ReplanRequested
    from .slow_node import SlowLinkDetector
    links_info = link_watch.start(rank, cfg.backend)
    links = SlowLinkDetector(cfg.slow_node.threshold, cfg.slow_node.link_threshold, cfg.slow_node.window,
                             [c["chip"] for c in chips])
    rp = MidRunReplan(cfg, plan, rank, el, book, weighted, log)
    losses, val_hist = [], []
    t_run = time.perf_counter()
    step, t0 = start, None
    try:
        for step in range(start, cfg.last_step):
            el.before_step(step + 1)  # test-only fault injection (HAL_TRAIN_FAULT)
            t0 = None
            lr = cfg.lr_at(step)
            if opt is not None:
                for g in opt.param_groups:
                    g["lr"] = lr
            x, y = train_batch(corpus, cfg.seed, step, G, seq)
            t0 = time.perf_counter()
            issue0 = link_watch.issue_seconds()
            mon.begin()
            loss = float(run.step(x, y))
            grad_norm = global_grad_norm(run, plan, rank, book)
            if opt is not None:
                opt.step()
                opt.zero_grad(set_to_none=True)
            losses.append(loss)
            done = step + 1
            issue = link_watch.issue_seconds() - issue0
            rec = mon.end(done, loss, lr, grad_norm, issue)  # every rank's timings (hal/trainer/metrics.py)
            _slow_links(rec, links, book, world, rank, done, log)
            if rank == 0:
                rec.update(el.step_done(done))  # attempt; restart (time to recover, steps lost) once recovered
            if cfg.log.val_interval and done % cfg.log.val_interval == 0 and done != cfg.last_step:
                rec["val_loss"] = _evaluate(run, params, vals)
                val_hist.append((done, rec["val_loss"]))
            mon.write(rec)  # rank 0: metrics.jsonl and the progress display
            if (cfg.checkpoint.enabled and cfg.checkpoint.interval and done % cfg.checkpoint.interval == 0
                    and done != cfg.last_step):
                saver.save(done)  # asynchronous: returns once the state is copied
            rp.after_step(done, mon.detector, saver, mon.records)  # a confirmed slow node may end the job (re-plan)
        t0 = None
        end = max(start, cfg.last_step)
        final_val = _evaluate(run, params, vals)
        val_hist.append((end, final_val))
        if saver is not None:
            if end > start:
                saver.save(end, final=True)
            saver.close()
        digest = _digest(run.full_parameters()) if run.active else ""
    except BaseException as exc:
        if not isinstance(exc, ReplanRequested):  # a re-plan is no failure (hal/trainer/replan.py)
            el.failed(step + 1, exc, None if t0 is None else time.perf_counter() - t0)
        raise
    finally:
        mon.close()
        link_watch.stop()
    train_s = time.perf_counter() - t_run
    summary = {"final_val_loss": final_val, "uniform_baseline": math.log(VOCAB), "start_step": start,
               "end_step": end, "steps": cfg.steps, "train_s": train_s, "world": world,
               "backend": cfg.backend, "plan_source": cfg.plan.source, "plan": json.loads(plan.to_json()),
               "val_losses": val_hist, "chips": chips}
    summary["checkpoints"] = saver.saved if saver is not None else []  # step, seconds the loop blocked, async
    summary["resumed"] = None if resumed is None else {
        "step": resumed.step, "resharded": resumed.resharded, "saved_world": resumed.saved_world, "load_s": resumed.load_s}
    if rank == 0:
        summary.update(el.finish())  # restarts: steps lost, time to recover (hal/trainer/elastic.py)
    if rank == 0:
        summary.update(mon.summary())  # medians, MFU per chip kind, slow nodes (hal/trainer/metrics.py)
        from .replan import plan_rows
        for r in summary.get("replans") or []:  # the job that ran on a re-plan: its tokens/s after it
            if r.get("attempt") == el.attempt:
                r["tokens_per_s_after"] = summary.get("tokens_per_s_median")
        summary.update({"slow_links": links.findings(), "link_measure": links_info,
                        "link_delayed": [{"rank": r, "seconds": d} for r, d in sorted(
                            link_watch.parse_link_delay(os.environ.get(link_watch.ENV, "")).items())],
                        "replan_recommended": rp.recommended, "rank_rows": plan_rows(plan, world)})
        summary.update(finish_report(cfg, plan, summary, log))  # efficiency vs parts, replan, plots
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        log(f"hal train: steps {start}..{end} in {train_s:.1f} s; final validation loss {final_val:.4f} nats "
            f"(uniform bytes: ln 256 = {math.log(VOCAB):.3f}); summary {run_dir / 'summary.json'}")
        for c in chips:
            log(f"  rank {c['rank']}: {c['chip']:<7} {'EMULATED on this host CPU' if c['emulated'] else 'native'}"
                f"  rows {c['rows']}")
        for f in summary["slow_links"]:
            log(f"  SLOW LINK: {links.describe(f)}")
        for r in summary.get("replans") or []:
            log(f"  re-planned mid-run at step {r['step']} for slow rank(s) {r['ranks']}: rows {r['rows_before']} -> "
                f"{r['rows_after']}; {r.get('restart_s') or 0:.1f} s from the decision to the first step on the new "
                f"plan")
        end_report(cfg, summary, log)  # plots, MFU per chip kind, slow nodes, then the efficiency figures
    return {"rank": rank, "chip": acc.chip.name, "start": start, "end": end, "losses": losses,
            "val": val_hist, "final_val_loss": final_val, "digest": digest, "resumed": summary["resumed"]}


def _slow_links(rec: dict, links, book, world: int, rank: int, done: int, log: Callable[[str], None]) -> None:
    """Every rank: the slow-link check (hal.trainer.slow_node.SlowLinkDetector) on each rank's link issue
    seconds of this step (gathered with the step's timings in RunMetrics.end), name the link of a newly
    found rank (collective, the same decision on every rank) and log it once on rank 0."""
    from . import link_watch
    from .slow_node import name_link
    found = links.update(rec["rank_link_issue_s"], rec["rank_step_s"], rec["rank_wait_s"])
    if not found:
        return
    rec["slow_link_ranks"] = [f["rank"] for f in found]
    new = [f for f in found if f.get("link") is None]
    if not new:
        return
    per_rank: list = [None] * world
    dist.all_gather_object(per_rank, link_watch.by_link(), group=book)
    for f in new:
        f["link"] = name_link(f["rank"], per_rank, links.chips)
        if rank == 0:
            log(f"  SLOW LINK at step {done}: {links.describe(f)}")


def main(argv: Optional[list] = None) -> int:
    from .args import add_arguments, load
    p = argparse.ArgumentParser(prog="python -m hal.trainer.loop", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    cfg = load(p.parse_args(argv))
    try:
        train(cfg, log=lambda s: print(s, flush=True))
    except BaseException as exc:  # under torchrun: exit now, torchrun restarts the job (hal/trainer/elastic.py)
        from .elastic import exit_failed, under_torchrun
        if under_torchrun():
            exit_failed(exc)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
