"""Broken plugin: the device runtime never comes up (its init waits for a device that does not answer).

`hal_device_runtime` blocks forever, so binding the chip hangs in every worker. The suite must cut
the binding at its bound, name the hook it was stuck in, and fail every worker-side check at once
instead of waiting the bound again for each one (the contract level still runs).
"""
import threading

import hal

from ._base import install

HANGS = True  # run by tests/test_conformance_bounds.py, with short bounds
BUG = "hal_device_runtime never returns"
CAUGHT_BY = "runtime.device_count"
LEVELS = ["contract", "runtime"]
SELECT = ["contract.registers", "runtime.device_count", "runtime.synchronize"]
STILL_PASSES = ["contract.registers"]
ALSO_FAILS = ["runtime.synchronize"]  # at once: the binding is not retried
MESSAGE = ["binding", "bad_hang_runtime.py"]


def _runtime() -> hal.DeviceRuntime:
    threading.Event().wait()  # the bug: the driver never answers
    return hal.CpuRuntime()


install(globals(), "bad_hang_runtime", BUG, runtime=_runtime)
