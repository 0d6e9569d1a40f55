"""Rank-side cases of tests/test_trainer_metrics.py and tests/test_slow_node.py, run in
hal.testing.worker_pool workers: one `hal train` run from a config dict, with HAL_TRAIN_THROTTLE set
for the run only (the workers' environment is fixed at pool start)."""
from __future__ import annotations

import os
from typing import Optional

from hal.trainer.config import TrainConfig
from hal.trainer.loop import train


def run(config: dict, throttle: Optional[str] = None) -> dict:
    if throttle:
        os.environ["HAL_TRAIN_THROTTLE"] = throttle
    try:
        return train(TrainConfig(**config), log=lambda s: None)
    finally:
        os.environ.pop("HAL_TRAIN_THROTTLE", None)
