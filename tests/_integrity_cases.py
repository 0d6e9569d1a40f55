"""Rank-side case of tests/test_checkpoint_integrity.py, run in hal.testing.worker_pool workers: a `hal train`
run from a config dict that also returns the warning lines rank 0's trainer logged (the console's lines)."""
from __future__ import annotations

import logging

from hal.trainer.config import TrainConfig
from hal.trainer.loop import train


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def run_with_warnings(config: dict) -> dict:
    handler = _Lines()
    logger = logging.getLogger("hal.trainer")
    logger.addHandler(handler)
    try:
        result = train(TrainConfig(**config), digest=True)  # the test compares parameter digests
    finally:
        logger.removeHandler(handler)
    return {**result, "warnings": handler.lines}
