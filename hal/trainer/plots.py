"""PNG plots of a `hal train` run from its metrics.jsonl (matplotlib, Agg: no display needed):

  loss.png            training loss per step and validation loss (with ln 256, uniform bytes)
  rank_step_time.png  each rank's step time (and its compute part, dashed), labelled with its chip
  tokens_per_chip.png tokens/s overall and per chip kind (token-equivalents, hal.trainer.metrics)
  rank_time_split.png each rank's time over the run split into compute, communication, pipeline
                      bubble and the rest, as measured (hal.trainer.metrics; records that carry the split)

    python -m hal.trainer.plots runs/train-tiny      # re-draw from a run directory
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Optional

from .metrics import read_metrics


def plot_run(run_dir: Path, chips: Optional[list[str]] = None, title: str = "") -> list[Path]:
    """Write the PNGs into `run_dir` (the split only when the records carry it); returns their paths
    ([] when there are no records)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    recs = read_metrics(run_dir / "metrics.jsonl")
    if not recs:
        return []
    if chips is None:
        summary = run_dir / "summary.json"
        chips = [c["chip"] for c in json.loads(summary.read_text())["chips"]] if summary.is_file() else None
    steps = [r["step"] for r in recs]
    out = []
    emulated = " (chips EMULATED on this host's CPU)" if title else ""

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [r["loss"] for r in recs], lw=1, label="train loss")
    vals = [(r["step"], r["val_loss"]) for r in recs if "val_loss" in r]
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    final = summary.get("val_losses", [])
    for s, v in final:
        if (s, v) not in vals:
            vals.append((s, v))
    if vals:
        vals.sort()
        ax.plot([s for s, _ in vals], [v for _, v in vals], "o-", label="validation loss")
    uniform = summary.get("uniform_baseline") or math.log(256)  # ln of the run's tokenizer vocab
    ax.axhline(uniform, color="grey", ls=":", label=f"uniform over the vocab (ln {round(math.exp(uniform))})")
    ax.set_xlabel("step"), ax.set_ylabel("cross entropy (nats)"), ax.legend()
    ax.set_title(f"loss {title}{emulated}".strip(), fontsize=9)
    out.append(_save(fig, run_dir / "loss.png", plt))

    fig, ax = plt.subplots(figsize=(7, 4))
    # A run restarted on another cluster (hal/trainer/elastic.py) has records of several world sizes:
    # each rank is drawn over the records that have it, and chip names (summary.json: the last
    # world's) label the ranks only when the world never changed.
    sizes = {len(r["rank_step_s"]) for r in recs}
    n = max(sizes)
    for i in range(n):
        mine = [r for r in recs if len(r["rank_step_s"]) > i]
        label = f"rank {i}" + (f" ({chips[i]})" if chips and len(sizes) == 1 and i < len(chips) else "")
        line, = ax.plot([r["step"] for r in mine], [r["rank_step_s"][i] * 1e3 for r in mine], lw=1, label=label)
        timed = [r for r in mine if len(r.get("rank_compute_s", ())) > i]
        if timed:
            ax.plot([r["step"] for r in timed], [r["rank_compute_s"][i] * 1e3 for r in timed], lw=0.8, ls="--",
                    color=line.get_color())
    ax.set_xlabel("step"), ax.set_ylabel("ms (solid: step, dashed: compute)"), ax.legend(fontsize=7)
    ax.set_title(f"per-rank step time {title}".strip(), fontsize=9)
    out.append(_save(fig, run_dir / "rank_step_time.png", plt))

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [r["tokens_per_s"] for r in recs], lw=1.2, color="black", label="all chips")
    kinds = list(dict.fromkeys(k for r in recs for k in r.get("tokens_per_s_chip", {})))  # every kind seen
    for k in kinds:
        ax.plot(steps, [r["tokens_per_s_chip"].get(k, 0.0) for r in recs], lw=1, label=k)
    ax.set_xlabel("step"), ax.set_ylabel("tokens/s"), ax.legend(fontsize=7)
    ax.set_title(f"tokens/s per chip kind {title}".strip(), fontsize=9)
    out.append(_save(fig, run_dir / "tokens_per_chip.png", plt))
    split = _split(recs)
    if split:
        fig, ax = plt.subplots(figsize=(7, 0.6 * len(split) + 1.5))
        colours = {"compute": "tab:blue", "comm": "tab:orange", "bubble": "tab:red", "other": "tab:grey"}
        for i, parts in enumerate(split):
            left = 0.0
            for key, frac in parts.items():
                ax.barh(i, frac * 100, left=left, color=colours[key], label=key if i == 0 else None)
                left += frac * 100
        ax.set_yticks(range(len(split)))
        ax.set_yticklabels([f"rank {i}" + (f" ({chips[i]})" if chips and len(sizes) == 1 and i < len(chips) else "")
                            for i in range(len(split))], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlim(0, 100)
        ax.set_xlabel("% of the rank's step time (sum over the run)")
        ax.legend(fontsize=7, ncol=4, loc="lower center", bbox_to_anchor=(0.5, 1.08), frameon=False)
        ax.set_title(f"measured time split per rank {title}".strip(), fontsize=9)
        out.append(_save(fig, run_dir / "rank_time_split.png", plt))
    return out


def _split(recs: list[dict]) -> list[dict]:
    """Per rank: {compute, comm, bubble, other} as fractions of its summed step time over the records
    whose split was measured for it ([] when none carries the split)."""
    n = max(len(r["rank_step_s"]) for r in recs)
    out = []
    for i in range(n):
        mine = [r for r in recs if len(r.get("rank_bubble_s") or ()) > i and r["rank_bubble_s"][i] is not None
                and r["rank_comm_s"][i] is not None]
        total = sum(r["rank_step_s"][i] for r in mine)
        if not mine or total <= 0:
            return []
        parts = {k: sum(r[f"rank_{k}_s"][i] or 0.0 for r in mine) / total
                 for k in ("compute", "comm", "bubble", "other")}
        out.append(parts)
    return out


def _save(fig, path: Path, plt) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    for p in plot_run(Path(sys.argv[1])):
        print(p)
