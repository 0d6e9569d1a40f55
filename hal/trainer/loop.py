"""The `hal train` rank entry, run on every rank under torchrun (`hal train` launches it):

    HAL_EMULATE=cuda:2,ascend:2 torchrun --nproc-per-node 4 -m hal.trainer.loop --config examples/train/tiny.toml

`main` reads the config and its command-line overrides (hal.trainer.args), sets up the console (the
`hal.trainer` logger's one handler, hal.trainer.console) and runs the Trainer (hal.trainer.trainer); a
rank that fails under torchrun exits at once (`exit_failed`) so torchrun can restart the job.
`train(cfg)` is the same run as a function, for callers that start the ranks themselves (the tests'
worker pools).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

from .config import TrainConfig
from .trainer import Trainer, make_plan  # noqa: F401 - make_plan: hal/cli/train.py checks the plan before launch


def train(cfg: TrainConfig, *, digest: bool = False) -> dict:
    """Run (or resume) the configured training on this rank; returns this rank's result (rank, chip,
    start/end step, losses, val losses, and with `digest=True` a SHA-256 of this rank's full parameters:
    a gather of its stages, for bitwise checks). Every rank of the world must call it."""
    return Trainer(cfg, digest=digest).train()


def exit_failed(exc: BaseException) -> None:
    """Under torchrun: end this rank now with exit code 1 after printing the error, without interpreter
    clean-up (an async checkpoint thread or a broken group could hold the exit up to a timeout). A
    slow-node re-plan (hal.trainer.replan.ReplanRequested) is no failure: one line, exit code EXIT_REPLAN."""
    import traceback

    from hal.launch.check import report_rank_failure
    from .replan import EXIT_REPLAN, ReplanRequested
    if isinstance(exc, ReplanRequested):
        print(f"hal train: {exc}; exiting with code {EXIT_REPLAN} for torchrun's restart", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_REPLAN)
    report_rank_failure(exc)  # the marked line `hal train` prints for the first failing rank
    traceback.print_exception(exc, file=sys.stderr)
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(1)


def run_rank(cfg: TrainConfig) -> int:
    """One rank's run with the config's chips and timing applied to this process (the launcher's
    environment alone decides nothing: hal.trainer.args.config_env) and the console set up; under
    torchrun a failure ends the rank at once."""
    from .args import apply_config_env
    from .console import setup_console
    from .elastic import under_torchrun
    apply_config_env(cfg)
    setup_console()
    try:
        train(cfg)
    except BaseException as exc:  # under torchrun: exit now, torchrun restarts the job (hal/trainer/elastic.py)
        if under_torchrun():
            exit_failed(exc)
        raise
    return 0


def main(argv: Optional[list] = None) -> int:
    from .args import add_arguments, load
    p = argparse.ArgumentParser(prog="python -m hal.trainer.loop", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run_rank(load(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
