"""`hal new-plugin` end to end, as a vendor would: generate `acme`, pip-install it into a throwaway site
folder, `hal info --json` lists it (native no, emulated yes), and the HAL op tests pass on it emulated
(`hal ops-check --chips acme`). Nothing of this repository is edited: everything lands in tmp folders.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hal.cli import main as hal_main

REPO = Path(__file__).resolve().parents[1]
HAL = str(Path(sys.executable).with_name("hal"))


def _run(cmd: list, env: dict | None = None, cwd: Path | None = None, timeout: float = 300):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} -> {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def acme(tmp_path_factory):
    root = tmp_path_factory.mktemp("acme")
    pkg, site = root / "pkg", root / "site"
    # `hal new-plugin acme --dir PKG`, through the CLI's entry function in this process (one torch
    # import fewer than a subprocess; same code path as the console script).
    assert hal_main(["new-plugin", "acme", "--dir", str(pkg)]) == 0
    generated = sorted(p.relative_to(pkg).as_posix() for p in pkg.rglob("*") if p.is_file())
    _run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
          "--no-build-isolation", "--target", site, pkg], cwd=root)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    env.pop("HAL_PLUGINS", None)
    env.pop("HAL_DISABLE_PLUGIN_AUTOLOAD", None)
    return root, pkg, site, env, generated


def test_generated_package_is_small_and_complete(acme):
    root, pkg, site, _, generated = acme
    assert REPO not in pkg.parents and REPO not in site.parents
    module = pkg / "hal_acme" / "__init__.py"
    assert generated == [
        "README.md", "hal_acme/__init__.py", "pyproject.toml", "tests/test_conformance.py"]
    assert len(module.read_text().splitlines()) <= 150
    assert 'acme = "hal_acme"' in (pkg / "pyproject.toml").read_text()
    assert (site / "hal_acme" / "__init__.py").is_file()
    assert any(p.name.startswith("hal_acme-0.1.0") and p.name.endswith(".dist-info") for p in site.iterdir())


def test_hal_info_lists_the_installed_plugin(acme):
    root, _, _, env, _ = acme
    info = json.loads(_run([HAL, "info", "--json", "--no-bind"], env=env, cwd=root).stdout)
    chip = {c["name"]: c for c in info["chips"]}["acme"]
    assert chip["native"] is False and chip["emulated"] is True
    assert (chip["torch_device_type"], chip["ccl_backend"], chip["plugin"]) == ("acme", "acmeccl", "acme")
    plugin = {p["name"]: p for p in info["plugins"]}["acme"]
    assert plugin["distribution"] == "hal-acme 0.1.0" and plugin["chips"] == ["acme"]


def test_op_tests_pass_on_it_emulated(acme):
    root, _, _, env, _ = acme
    if importlib.util.find_spec("hal.cli_ops_check") is not None:
        res = json.loads(_run([HAL, "ops-check", "--chips", "acme", "--dtype", "float32,bfloat16", "--json"],
                              env=env, cwd=root).stdout)
        (chip,) = res["chips"]
        assert (chip["chip"], chip["plugin"], chip["emulated"], chip["ok"]) == ("acme", "acme", True, True)
        assert res["ok"] and len(chip["results"]) >= 13 * 2
        return
    script = ("import torch, hal\nfrom hal.ops import golden, OP_NAMES\nacc = hal.bind('acme', emulated=True)\n"
              "bad = [r.describe() for op in OP_NAMES for r in golden.check_op(getattr(hal.ops, op), op, "
              "torch.float32, acc.kernels[op].describe()) if not r.ok]\nassert not bad, bad\nprint('ok', acc)\n")
    assert "ok Accelerator(chip='acme', emulated" in _run([sys.executable, "-c", script], env=env, cwd=root).stdout


def test_refuses_bad_names_and_nonempty_dirs(tmp_path, capsys):
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    cases = [(["new-plugin", "Acme-2", "--dir", str(tmp_path / "a")], "NAME 'Acme-2' is not a valid chip name"),
             (["new-plugin", "class", "--dir", str(tmp_path / "b")], "not a Python keyword"),
             (["new-plugin", "cpu", "--dir", str(tmp_path / "c")], "chip 'cpu' is already provided"),
             (["new-plugin", "zeta", "--dir", str(full)], "exists and is not empty")]
    for argv, message in cases:
        assert hal_main(argv) == 2, argv
        assert message in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"] and (full / "keep.txt").read_text() == "mine"
