"""Rank-side case of tests/test_trainer_metrics.py's measured step split: one `hal train` run under
TIMED emulation (hal.emulation.timed) in a worker pool started without it: HAL_EMULATE_TIMED is set for the run
only, and the clock the trainer installs is uninstalled after it, so later cases in the same workers
run untimed again."""
from __future__ import annotations

import os

from hal.trainer.config import TrainConfig
from hal.trainer.loop import train


def run_timed(config: dict, scale: str) -> dict:
    os.environ["HAL_EMULATE_TIMED"], os.environ["HAL_EMULATE_TIME_SCALE"] = "1", scale
    os.environ["HAL_EMULATE_TIMED_DTYPE"] = "bfloat16"  # float32 ops at bf16: the 910B2 / P800 have no fp32 figure
    try:
        return train(TrainConfig(**config))
    finally:
        os.environ.pop("HAL_EMULATE_TIMED", None)
        os.environ.pop("HAL_EMULATE_TIME_SCALE", None)
        os.environ.pop("HAL_EMULATE_TIMED_DTYPE", None)
        from hal.emulation import timed
        timed.uninstall()
