"""Rank-side cases of tests/test_train.py, run in hal.testing.worker_pool workers: one `hal train`
run (hal.trainer.loop.train) from a config dict, returning what the test compares."""
from __future__ import annotations

from hal.trainer.config import TrainConfig
from hal.trainer.loop import train


def run(config: dict) -> dict:
    return train(TrainConfig(**config))
