"""Rank-side case of tests/test_slow_node.py, run in hal.testing.worker_pool workers: one `hal train` run
from a config dict with the test-only HAL_TRAIN_THROTTLE and HAL_TRAIN_LINK_DELAY set for this run only
(the workers' environment is fixed at pool start, and a pooled worker runs the next test too)."""
from __future__ import annotations

import os
from typing import Optional

from hal.trainer.config import TrainConfig
from hal.trainer.loop import train


def run(config: dict, throttle: Optional[str] = None, link_delay: Optional[str] = None) -> dict:
    for key, value in (("HAL_TRAIN_THROTTLE", throttle), ("HAL_TRAIN_LINK_DELAY", link_delay)):
        if value:
            os.environ[key] = value
    try:
        return train(TrainConfig(**config), log=lambda s: None)
    finally:
        os.environ.pop("HAL_TRAIN_THROTTLE", None)
        os.environ.pop("HAL_TRAIN_LINK_DELAY", None)
