"""The end of a `hal train` run on rank 0: the efficiency figures against the parts
(hal.trainer.parts), the optional slow-node re-plan (hal.trainer.slow_node), summary.json, the PNG plots
(hal.trainer.plots), and the closing lines: the run's result, the chip of every rank, slow links and
re-plans, MFU per chip kind, slow nodes, and last the MIXED-CLUSTER EFFICIENCY."""
from __future__ import annotations

import json
import logging
import math

from .data import VOCAB
from .metrics import fmt_rate
from .parts import efficiency, report

log = logging.getLogger(__name__)


def write_report(cfg, plan, summary: dict, slow_links) -> None:
    """Rank 0 at the end of a run: complete and write summary.json, then log the closing lines
    (`slow_links`: the run's hal.trainer.slow_node.SlowLinkDetector, which describes its findings)."""
    summary.update(finish_report(cfg, plan, summary))
    path = cfg.run_dir / "summary.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    uniform = summary.get("uniform_baseline", math.log(VOCAB))  # ln of the tokenizer's vocab
    vocab = round(math.exp(uniform))
    log.info(f"hal train: steps {summary['start_step']}..{summary['end_step']} in {summary['train_s']:.1f} s; final "
             f"validation loss {summary['final_val_loss']:.4f} nats (uniform {'bytes' if vocab == VOCAB else 'tokens'}:"
             f" ln {vocab} = {uniform:.3f}); summary {path}")
    for c in summary["chips"]:
        log.info(f"  rank {c['rank']}: {c['chip']:<7} {'EMULATED on this host CPU' if c['emulated'] else 'native'}"
                 f"  rows {c['rows']}")
    for f in summary["slow_links"]:
        log.info(f"  SLOW LINK: {slow_links.describe(f)}")
    for r in summary.get("replans") or []:
        log.info(f"  re-planned mid-run at step {r['step']} for slow rank(s) {r['ranks']}: rows {r['rows_before']} -> "
                 f"{r['rows_after']}; {r.get('restart_s') or 0:.1f} s from the decision to the first step on the new "
                 f"plan")
    end_report(cfg, summary)  # plots, MFU per chip kind, slow nodes, then the efficiency figures


def finish_report(cfg, plan, summary: dict) -> dict:
    """Figures added to summary.json before it is written: efficiency, even_efficiency, the parts'
    tokens/s, and (slow_node.replan) the path of the re-weighted plan."""
    if cfg.efficiency.part:
        return {}
    out = efficiency(cfg, summary.get("tokens_per_s_median"))
    if cfg.slow_node.replan and summary.get("slow_nodes"):
        from .slow_node import replan
        med = summary.get("rank_device_s_median")  # what the detector measured (the chip's own time)
        try:
            new = replan(plan, med)
            path = cfg.run_dir / "replan.json"
            path.write_text(new.to_json() + "\n")
            out["replan"] = str(path)
        except Exception as exc:  # a plan the re-weighting cannot express: say so, keep the run's result
            out["replan_error"] = f"{type(exc).__name__}: {exc}"
    return out


def split_lines(summary: dict) -> list[str]:
    """Each rank's step split (median shares: compute, communication, pipeline bubble, the rest), as
    measured (hal.trainer.metrics: summary's `split_measure` says how), next to the plan's bubble estimate."""
    step = summary.get("rank_step_s_median") or []
    if not step or not summary.get("rank_compute_share_median"):
        return []
    chips = [c["chip"] for c in summary.get("chips") or []]

    def pct(key: str, i: int) -> str:
        v = (summary.get(key) or [None] * len(step))[i]
        return "n/a" if v is None else f"{v * 100:.0f}%"
    lines = [f"  step time split per rank (median; measured: {summary.get('split_measure', '?')}; "
             f"1F1B bubble ESTIMATE of the plan {summary.get('bubble_est', 0) * 100:.0f}%):"]
    for i, s in enumerate(step):
        chip = chips[i] if i < len(chips) else "?"
        ms = "n/a" if s is None else f"{s * 1e3:.1f} ms"
        lines.append(f"    rank {i} {chip:<7} step {ms}: compute {pct('rank_compute_share_median', i)}, "
                     f"comm {pct('rank_comm_share_median', i)}, bubble {pct('rank_bubble_share_median', i)}")
    return lines


def _plots(cfg, summary: dict) -> None:
    """The run's PNG plots (hal.trainer.plots) and their line; `log.plots = false` skips this."""
    try:
        from .plots import plot_run
        pngs = plot_run(cfg.run_dir, [c["chip"] for c in summary["chips"]],
                        title=f"({'timed emulation' if summary.get('timed_emulation') else 'emulated'})")
        if pngs:
            log.info("  plots: " + ", ".join(str(p) for p in pngs))
    except ImportError as exc:  # matplotlib is the [train] extra's
        log.info(f"  plots: not drawn ({exc}; pip install 'hetero-hal[train]')")


def end_report(cfg, summary: dict) -> None:
    """The closing lines (after summary.json is written: the plots read it)."""
    if cfg.log.plots:
        _plots(cfg, summary)
    tps = summary.get("tokens_per_s_chip_median") or {}
    mfu = summary.get("mfu_chip_median") or {}
    peaks = {c: p for c, p in (summary.get("mfu_peaks") or {}).items()}
    for k in tps:
        m = mfu.get(k)
        p = peaks.get(k, {})
        share = "n/a" if m is None else f"{m * 100:.1f}%"
        log.info(f"  {k:<7} {fmt_rate(tps[k])} tok/s (token-equivalents), MFU {share} of {p.get('used', 'its peak')}")
    for line in split_lines(summary):
        log.info(line)
    for f in summary.get("slow_nodes") or []:
        log.info(f"  SLOW NODE: rank {f['rank']} ({f['chip']}) {f['slowdown']:.2f}x its expected compute time "
                 f"(first seen at detector step {f['first_step']})")
    if summary.get("replan"):
        log.info(f"  re-planned with the slow rank(s) weighted down: {summary['replan']} "
                 f"(resume with --plan {summary['replan']})")
    if cfg.efficiency.part:  # one of --measure-parts' runs: the main run prints the figures
        return
    for line in report(summary, bool(summary.get("timed_emulation")), summary.get("plan_source", "?")):
        log.info(line)
