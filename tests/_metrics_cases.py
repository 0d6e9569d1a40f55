"""Rank-side cases of tests/test_trainer_metrics.py, run in hal.testing.worker_pool workers: one
`hal train` run from a config dict (a test-only throttle goes in its `debug` section)."""
from __future__ import annotations

from hal.trainer.config import TrainConfig
from hal.trainer.loop import train


def run(config: dict) -> dict:
    return train(TrainConfig(**config), digest=True)  # the tests compare parameter digests
