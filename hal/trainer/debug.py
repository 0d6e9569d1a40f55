"""Test-only fault injection of a `hal train` run, from the config's `[debug]` section (hal.trainer.config
DebugSection): the one place the trainer breaks or slows itself on purpose, so the tests can drive fault
handling (hal.trainer.elastic) and the slow-node and slow-link checks (hal.trainer.slow_node,
hal.trainer.link_watch) end to end. A real run has no `[debug]` section and this component does nothing.

    [[debug.faults]]          # rank 1 dies inside its next bridge collective of step 3 (first job only)
    action = "kill"
    rank = 1
    step = 3
    [[debug.faults]]          # rank 0's first gradient becomes NaN after the backward of step 2
    action = "nan_grad"
    rank = 0
    step = 2
    [debug]
    throttle = { 1 = 4.0 }    # rank 1's timed-emulation chip charges every op 4x its profile's time
    link_delay = { 2 = 0.1 }  # rank 2 sleeps 0.1 s before each collective or send it submits

Faults: each entry fires on `rank` during step `step` (1-based) of the job whose torchrun restart count is
`restart` (default 0, so a restarted job does not fail again). On the `hetero` backend it arms
hal.ccl_bridge.faults at `point` (default `collective.start`: the rank's next collective of the step):
`kill` exits the process there (os._exit(17)), `freeze` sleeps `seconds` inside the collective with its
connections open (the rank's peers then time out, as NCCL's watchdog would). On another backend the rank
exits or sleeps at the start of the step. `nan_grad` fills the rank's first parameter's gradient with
NaN after the step's backward, before the non-finite check (hal.trainer.nonfinite; not a failure record).
An injected fault is recorded (through `record`, the
elastic component's failure record) when it is armed.

Throttle needs timed emulation (a chip clock to slow): without one it is a DebugError. A link delay needs
the `hetero` backend (the bridge's Python process group, where hal.trainer.link_watch hooks submissions).
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Optional

from hal.contract.errors import HalError

log = logging.getLogger(__name__)


class DebugError(HalError, ValueError):
    """A `[debug]` setting that cannot apply to this run (names the field)."""


class FaultInjector:
    """One rank's share of the `[debug]` section: its faults, its chip's throttle and its link delay."""

    def __init__(self, debug, rank: int, attempt: int, backend: str,
                 record: Optional[Callable[[dict], None]] = None) -> None:
        self.rank, self.attempt, self.backend, self.record = rank, attempt, backend, record
        self.faults = [f for f in debug.faults if f.rank == rank and f.restart == attempt]
        self.throttle_factor = float(debug.throttle.get(rank, 0.0))
        self.link_delay_s = float(debug.link_delay.get(rank, 0.0))
        self.link_delays = dict(debug.link_delay)  # every rank's, for summary.json
        if self.link_delay_s and backend != "hetero":
            raise DebugError(f"debug.link_delay[{rank}] = {self.link_delay_s}: delaying rank {rank}'s link needs "
                             f"backend 'hetero' (the bridge's Python group), not {backend!r}")
        if rank == 0 and debug.active:
            log.info("hal train: [debug] section set: test-only fault injection (faults %d, throttle %s, "
                     "link delay %s)", len(debug.faults), dict(debug.throttle), dict(debug.link_delay))

    def before_step(self, step: int) -> None:
        """Fire this rank's faults for step `step` (1-based)."""
        for fault in self.faults:
            if fault.step == step and fault.action != "nan_grad":
                self._fire(fault, step)

    def after_backward(self, step: int, named: list) -> None:
        """Fire this rank's `nan_grad` faults for step `step` (1-based): its first gradient becomes NaN."""
        for fault in self.faults:
            if fault.step == step and fault.action == "nan_grad":
                name, param = next((n, p) for n, p in named if p.grad is not None)
                grad = param.grad.to_local() if hasattr(param.grad, "to_local") else param.grad
                grad.fill_(float("nan"))
                log.info("hal train: rank %d: injecting NaN into the gradient of %s at step %d (debug.faults, "
                         "test only)", self.rank, name, step)

    def _fire(self, fault, step: int) -> None:
        if self.record is not None:
            self.record({"injected": fault.action, "step": step,
                         "point": fault.point if self.backend == "hetero" else "step start",
                         "error": f"injected {fault.action} (debug.faults)"})
        log.info("hal train: rank %d: injecting %s at step %d (debug.faults, test only)", self.rank,
                 fault.action, step)
        if self.backend == "hetero":
            from hal.ccl_bridge import faults
            faults.arm(fault.point, fault.action, after=0, seconds=fault.seconds)
        elif fault.action == "kill":
            os._exit(17)
        else:
            time.sleep(fault.seconds)

    def throttle(self, clock: Any) -> float:
        """Slow this rank's timed-emulation clock by its throttle factor; returns the factor (0.0: none)."""
        factor = self.throttle_factor
        if not factor:
            return 0.0
        if clock is None:
            raise DebugError(f"debug.throttle[{self.rank}] = {factor:g}: throttling rank {self.rank} needs timed "
                             f"emulation (HAL_EMULATE_TIMED=1 or cluster.timed = true in the config)")
        from hal.emulation.timed import Speeds
        s = clock.speeds
        clock.speeds = Speeds(s.flops_per_s / factor, s.bytes_per_s / factor,
                              f"{s.source}; THROTTLED x{factor:g} (debug.throttle, test only)")
        return factor
