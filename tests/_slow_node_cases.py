"""Rank-side case of tests/test_slow_node.py, run in hal.testing.worker_pool workers: one `hal train` run
from a config dict; the test-only throttle and link delay are the config's `[debug]` section, so nothing
outlives the run in the pooled worker."""
from __future__ import annotations

from hal.trainer.config import TrainConfig
from hal.trainer.loop import train


def run(config: dict) -> dict:
    return train(TrainConfig(**config))
