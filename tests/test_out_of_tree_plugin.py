"""An out-of-tree vendor plugin is found with no change to this repository: a tiny package with its
own pyproject.toml and a `hal.plugins` entry point is pip-installed into a temporary site dir, and
`hal info --json`, run with that dir on PYTHONPATH, lists its plugin (with its distribution name)
and its chip. No network: `--no-build-isolation` builds with the setuptools already installed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import hal

PYPROJECT = textwrap.dedent('''
    [build-system]
    requires = ["setuptools>=61"]
    build-backend = "setuptools.build_meta"

    [project]
    name = "acme-hal-plugin"
    version = "0.3.1"
    description = "HAL plugin for the Acme accelerator (runs on the host CPU)"
    requires-python = ">=3.10"

    [project.entry-points."hal.plugins"]
    acme = "acme_hal"

    [tool.setuptools]
    packages = ["acme_hal"]
''')

PLUGIN = textwrap.dedent('''
    """Acme's HAL plugin: the made-up chip `acme`, which runs on the host CPU."""
    import hal
    from hal.emulation.emulate import cpu_fabric_capabilities, create_cpu_process_group

    CHIP = hal.ChipSpec(name="acme", vendor="Acme Corp", torch_device_type="cpu", ccl_backend="gloo",
                        ccl_name="ACCL", visible_devices_env="ACME_VISIBLE_DEVICES")

    @hal.hookimpl
    def hal_plugin_info():
        return hal.PluginInfo(name="acme", version="0.3.1", contract_version=hal.CONTRACT_VERSION)

    @hal.hookimpl
    def hal_chips():
        return [CHIP]

    @hal.hookimpl
    def hal_native_available(chip):
        return False   # no Acme silicon here: the chip runs emulated

    @hal.hookimpl
    def hal_chip_profile(chip, model):
        return hal.ChipProfile(
            chip="acme", model="Acme A1",
            peak_flops={"bfloat16": hal.Figure(value=2e14, unit="FLOP/s", source="Acme A1 datasheet, p. 3")},
            memory_bytes=hal.Figure(value=32e9, unit="B", source="Acme A1 datasheet, p. 3"),
            memory_bandwidth=hal.unknown("B/s"), intra_node_bandwidth=hal.unknown("B/s"),
            nic_bandwidth=hal.unknown("B/s"))

    @hal.hookimpl
    def hal_device_runtime(chip):
        return hal.CpuRuntime()

    @hal.hookimpl
    def hal_create_process_group(chip, store, rank, world_size, timeout):
        return create_cpu_process_group(store, rank, world_size, timeout)

    @hal.hookimpl
    def hal_collective_capabilities(chip):
        caps = cpu_fabric_capabilities("gloo")
        return hal.CapabilityMatrix(chip="acme", entries=caps.entries, source="Acme: gloo on the host")
''')


def _write_package(root: Path) -> Path:
    pkg = root / "acme-hal-plugin"
    (pkg / "acme_hal").mkdir(parents=True)
    (pkg / "pyproject.toml").write_text(PYPROJECT)
    (pkg / "acme_hal" / "__init__.py").write_text(PLUGIN)
    return pkg


def test_out_of_tree_plugin_is_discovered(tmp_path):
    repo = Path(hal.__file__).resolve().parent.parent
    pkg = _write_package(tmp_path / "src")
    site = tmp_path / "site"
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONNOUSERSITE="1")
    for switch in ("HAL_PLUGINS", "HAL_DISABLE_PLUGIN_AUTOLOAD", "HAL_EMULATE", "HAL_CHIP", "HAL_CLUSTER"):
        env.pop(switch, None)   # the default discovery path: entry points, autoload on
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
         "--quiet", "--target", str(site), str(pkg)],
        capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert install.returncode == 0, install.stdout + install.stderr
    assert (site / "acme_hal" / "__init__.py").exists()
    assert list(site.glob("acme_hal_plugin-0.3.1.dist-info/entry_points.txt"))

    env["PYTHONPATH"] = os.pathsep.join([str(site)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    hal_cmd = Path(sys.executable).with_name("hal")
    cmd = [str(hal_cmd)] if hal_cmd.exists() else [sys.executable, "-m", "hal.cli"]
    run = subprocess.run(cmd + ["info", "--json"], capture_output=True, text=True, env=env, timeout=120,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    info = json.loads(run.stdout)

    plugins = {p["name"]: p for p in info["plugins"]}
    assert "cpu" in plugins, "the in-tree reference plugin is still found alongside"
    acme = plugins["acme"]
    assert acme["distribution"] == "acme-hal-plugin 0.3.1"
    assert acme["version"] == "0.3.1" and acme["contract_version"] == hal.CONTRACT_VERSION
    assert acme["chips"] == ["acme"]
    chips = {c["name"]: c for c in info["chips"]}
    assert chips["acme"]["torch_device_type"] == "cpu" and chips["acme"]["ccl_backend"] == "gloo"
    assert chips["acme"]["native"] is False and chips["acme"]["emulated"] is True
    assert chips["acme"]["profile_model"] == "Acme A1"
    # Nothing was installed into, or written under, this repository or its venv.
    assert repo not in site.parents and not (repo / "acme_hal").exists()
    assert not list(Path(sys.prefix).glob("lib/python*/site-packages/acme_hal*"))
