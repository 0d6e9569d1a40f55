"""The trainer's console: every module of hal.trainer logs to a logger under `hal.trainer`, and the
process's entry point (hal.trainer.loop.main, `hal train` under torchrun, the `hal demo` rank job) calls
`setup_console()` once, which prints INFO records as bare lines on stdout - the lines users and tests of
`hal train` read. A library caller that sets nothing up (the tests' worker pools) sees nothing below
WARNING."""
from __future__ import annotations

import logging
import sys
from typing import Optional, TextIO

LOGGER = "hal.trainer"


def setup_console(level: int = logging.INFO, stream: Optional[TextIO] = None) -> logging.Handler:
    """Attach the one console handler to the `hal.trainer` logger (again: the existing one is returned)."""
    logger = logging.getLogger(LOGGER)
    for handler in logger.handlers:
        if getattr(handler, "_hal_console", False):
            return handler
    handler = logging.StreamHandler(stream if stream is not None else sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler._hal_console = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    return handler
