"""The generated plugin package: `pytest tests` works after installing it with its `test` extra, and the
install route it documents is the one that works (hal from its checkout; hetero-hal is on no index)."""
from __future__ import annotations

import pytest

from hal.cli.new_plugin import render

tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def test_generated_pyproject_has_a_test_extra_with_pytest(tmp_path):
    render("acme", tmp_path / "hal-acme")
    project = tomllib.loads((tmp_path / "hal-acme" / "pyproject.toml").read_text())["project"]
    assert any(r.startswith("pytest") for r in project["optional-dependencies"]["test"])
    assert project["entry-points"]["hal.plugins"] == {"acme": "hal_acme"}
    readme = (tmp_path / "hal-acme" / "README.md").read_text()
    assert "pip install -e '.[test]'" in readme and "on no package index" in readme
