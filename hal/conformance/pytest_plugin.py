"""The conformance suite as a pytest plugin: `pytest -p hal.conformance --hal-plugin NAME [-k EXPR]`.

Each check becomes one test item named by its id (`contract.registers`, `ops.rms_norm.bfloat16`,
...), so `-k`, `--junitxml`, `-x`, `--lf` and a vendor's own CI reporting work as with any test.
The items run through the same engine as `hal conformance` (`hal.conformance.runner.Runner`, one worker
pool per session). Without `--hal-plugin` the plugin does nothing, so `-p hal.conformance` may sit in
addopts. When no test paths are given on the command line, only the suite is collected (not the
project's own tests found through `testpaths` or the current directory); give paths to run both.

The hooks live here and are imported by `hal/conformance/__init__.py` (pytest's `-p hal.conformance` loads
that module); pytest itself is imported only when the plugin is active.
"""
from __future__ import annotations

from typing import Any


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("hal-conformance", "HAL conformance suite (active with --hal-plugin)")
    group.addoption("--hal-plugin", default=None, metavar="NAME",
                    help="run the conformance suite on this plugin (entry-point name or module path)")
    group.addoption("--hal-chip", default=None, metavar="CHIP", help="which of the plugin's chips (default: its first)")
    group.addoption("--hal-emulate", action="store_true", default=False, help="run the chip emulated on the CPU")
    group.addoption("--hal-level", default="all", metavar="LEVELS",
                    help="comma-separated levels (contract,runtime,ops,collectives,bridge,errors,perf), core or all")
    group.addoption("--hal-nproc", type=int, default=None, metavar="N",
                    help="ranks for multi-process levels (default 4 for cpu and emulated chips, else 2)")
    group.addoption("--hal-timeout", type=float, default=60.0, metavar="S",
                    help="seconds a collective may take before the group must raise (default 60)")
    group.addoption("--hal-json", default=None, metavar="FILE", help="also write the suite's JSON report")
    group.addoption("--hal-report", default=None, metavar="FILE", help="also write the human report (.md/.html)")


def pytest_configure(config: Any) -> None:
    if not config.getoption("hal_plugin", default=None):
        return
    from .checks import LEVELS
    from .pytest_items import ConformanceSession
    config.addinivalue_line("markers", "hal_conformance: a HAL conformance check")
    for level in LEVELS:
        config.addinivalue_line("markers", f"hal_{level}: a HAL conformance check of level {level}")
    config.pluginmanager.register(ConformanceSession(config), "hal-conformance-session")
