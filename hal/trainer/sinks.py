"""Metric sinks of a `hal train` run: where rank 0 sends each step's scalars besides metrics.jsonl (which
stays the primary, complete record; hal.trainer.metrics writes it).

A sink is anything with `write(step, scalars)` and `close()` (`MetricSink`): `scalars` is a flat
{tag: float} dict (`scalars_of` turns a metrics.jsonl record into it). Built in: `TensorBoardSink`
(`[log] tensorboard = true`: event files under <run dir>/tensorboard through
torch.utils.tensorboard.SummaryWriter; the `tensorboard` extra). More sinks are registered in the config:
`[log] sinks = ["my_pkg.my_mod:make_sink"]`, each a factory called as `factory(run_dir, chips)` (chips: each
rank's chip kind) on rank 0 that returns a MetricSink (e.g. one forwarding to Weights & Biases or MLflow).
A sink that raises in `write` is closed and dropped with one warning; the run goes on.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import math
import sys
from pathlib import Path
from typing import Any, Optional, Protocol, runtime_checkable

TENSORBOARD_EXTRA = "tensorboard"  # pyproject.toml's extra that installs the tensorboard package

log = logging.getLogger(__name__)


@runtime_checkable
class MetricSink(Protocol):
    """Receives every step's scalars on rank 0 (after metrics.jsonl has the record)."""

    def write(self, step: int, scalars: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def installed(module: str) -> bool:
    """Whether `module` can be imported (None in sys.modules, as a test sets it, counts as missing)."""
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# the per-rank lists of a record and the tag group each goes to (one chart per field, a line per rank)
_RANK_FIELDS = ("step_s", "compute_s", "wait_s", "comm_s", "bubble_s", "other_s", "device_s")


def scalars_of(rec: dict, chips: list[str]) -> dict[str, float]:
    """The TensorBoard tags of a metrics.jsonl record: train/loss, train/lr, train/grad_norm, val/loss,
    throughput/tokens_per_s, throughput/step_s, tokens_per_s/<chip kind>, mfu/<chip kind>, and per rank
    rank_<field>/r<rank>_<chip> for its step time split (step, compute, wait, comm, bubble, other, device
    seconds). Missing or non-finite values are left out."""
    out: dict[str, Any] = {"train/loss": rec.get("loss"), "train/lr": rec.get("lr"),
                           "train/grad_norm": rec.get("grad_norm"), "val/loss": rec.get("val_loss"),
                           "throughput/tokens_per_s": rec.get("tokens_per_s"), "throughput/step_s": rec.get("step_s")}
    for kind, v in (rec.get("tokens_per_s_chip") or {}).items():
        out[f"tokens_per_s/{kind}"] = v
    for kind, v in (rec.get("mfu_chip") or {}).items():
        out[f"mfu/{kind}"] = v
    for name in _RANK_FIELDS:
        for r, v in enumerate(rec.get(f"rank_{name}") or ()):
            out[f"rank_{name}/r{r}_{chips[r] if r < len(chips) else '?'}"] = v
    return {k: float(v) for k, v in out.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


class TensorBoardSink:
    """Event files under `log_dir` (torch.utils.tensorboard.SummaryWriter), one scalar per tag and step."""

    def __init__(self, log_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # config validation refuses log.tensorboard without it; a direct caller too
            raise ImportError(f"TensorBoard event files need the tensorboard package: "
                              f"pip install 'hetero-hal[{TENSORBOARD_EXTRA}]' ({exc})") from exc
        self.log_dir = Path(log_dir)
        self.writer: Optional[Any] = SummaryWriter(log_dir=str(self.log_dir))

    def write(self, step: int, scalars: dict[str, float]) -> None:
        if self.writer is None:
            return
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def factory(spec: str):
    """The callable a `log.sinks` entry 'module:factory' names (ValueError saying why not)."""
    mod, _, name = spec.partition(":")
    if not mod or not name:
        raise ValueError("expected 'module:factory'")
    try:
        return getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load it: {type(exc).__name__}: {exc}") from None


def open_sinks(cfg, chips: list[str]) -> list[MetricSink]:
    """Rank 0's sinks for this run: TensorBoard if `log.tensorboard`, then each `log.sinks` factory's."""
    sinks: list[MetricSink] = []
    if cfg.log.tensorboard:
        sinks.append(TensorBoardSink(cfg.run_dir / "tensorboard"))
    for spec in cfg.log.sinks:
        sink = factory(spec)(cfg.run_dir, list(chips))
        if not isinstance(sink, MetricSink):
            raise ValueError(f"log.sinks entry {spec!r} returned {type(sink).__name__}, which has no write(step, "
                             f"scalars) and close()")
        sinks.append(sink)
    return sinks


class Sinks:
    """The open sinks of a run: `write(step, rec)` sends a record's scalars to each; a failing sink is dropped."""

    def __init__(self, sinks: list[MetricSink], chips: list[str]) -> None:
        self.sinks, self.chips = list(sinks), list(chips)

    def write(self, step: int, rec: dict) -> None:
        if not self.sinks:
            return
        scalars = scalars_of(rec, self.chips)
        for sink in list(self.sinks):
            try:
                sink.write(step, scalars)
            except Exception as exc:  # a sink must not end the run: metrics.jsonl has the record
                log.warning("hal train: metric sink %s failed at step %d (%s: %s); dropped, metrics.jsonl goes on",
                            type(sink).__name__, step, type(exc).__name__, exc)
                self.sinks.remove(sink)
                _close(sink)

    def close(self) -> None:
        for sink in self.sinks:
            _close(sink)
        self.sinks = []


def _close(sink: MetricSink) -> None:
    try:
        sink.close()
    except Exception as exc:
        log.warning("hal train: metric sink %s failed to close (%s: %s)", type(sink).__name__, type(exc).__name__, exc)
