"""conformance: the suite a chip vendor runs against its plugin.

Two front ends over one engine: `hal conformance --plugin NAME` (`hal/cli/conformance.py`) and the pytest
plugin `pytest -p hal.conformance --hal-plugin NAME` (its hooks are imported below; pytest is imported
only when `--hal-plugin` is given). `hal.conformance.suite.run_suite` is the programmatic entry.
"""
from .pytest_plugin import pytest_addoption, pytest_configure

__all__ = ["pytest_addoption", "pytest_configure"]
