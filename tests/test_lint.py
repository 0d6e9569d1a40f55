"""Lint and types, as CI runs them: `python -m ruff check .` and `python -m mypy` (their settings are
[tool.ruff] and [tool.mypy] in pyproject.toml). Each fails with the tool's own report; a tool that
is not installed (`pip install -e .[test]` installs both) skips its test."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(tool: str, args: list, timeout: int) -> subprocess.CompletedProcess:
    if importlib.util.find_spec(tool) is None:
        pytest.skip(f"{tool} is not installed (pip install -e .[test])")
    return subprocess.run([sys.executable, "-m", tool, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_ruff_finds_nothing():
    proc = _run("ruff", ["check", "--no-cache", "."], timeout=300)
    assert proc.returncode == 0, f"ruff check . found:\n{proc.stdout}{proc.stderr}"


def test_mypy_finds_nothing():
    proc = _run("mypy", [], timeout=900)
    assert proc.returncode == 0, f"mypy found:\n{proc.stdout}{proc.stderr}"
