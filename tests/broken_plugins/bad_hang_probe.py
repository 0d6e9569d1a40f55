"""Broken plugin: `hal_native_available` blocks forever (it initializes the driver to count devices).

The probe runs in the suite's own process (loading the target, the contract level): the suite must
bound it, report where it was stuck, and still give a verdict.
"""
import threading

from ._base import install

HANGS = True  # run by tests/test_conformance_bounds.py, with short bounds
BUG = "hal_native_available never returns"
CAUGHT_BY = "contract.native_probe"
LEVELS = ["contract"]
SELECT = ["contract.registers", "contract.native_probe"]
STILL_PASSES = ["contract.registers"]
MESSAGE = ["did not return within", "bad_hang_probe.py"]


def _native() -> bool:
    threading.Event().wait()  # the bug
    return True


install(globals(), "bad_hang_probe", BUG, native=_native)
