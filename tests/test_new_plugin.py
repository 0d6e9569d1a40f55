"""`hal new-plugin` end to end, as a vendor would: generate `acme`, pip-install it into a throwaway site
folder, `hal info --json` lists it (native no, emulated yes), and the HAL op tests pass on it emulated
(`hal ops-check --chips acme`). Then two native plugins from the template, with only the values
docs/writing-a-plugin.md tells a vendor to set: a chip on host tensors with gloo as its CCL, and one
whose CCL a stand-in adapter registers with `Backend.register_backend`; both pass `hal conformance`
on the levels their generated code decides (no private torch API in the template), the first becomes
the default chip with a warning, and the measuring tool measures the second's own group. Nothing of
this repository is edited: everything lands in tmp folders.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
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
    if importlib.util.find_spec("hal.cli.ops_check") is not None:
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


# ---- a native plugin from the template, with only the values docs/writing-a-plugin.md tells a vendor to set
DOC = REPO / "docs" / "writing-a-plugin.md"
# Two chips that run natively here: host tensors with gloo as the CCL, and host tensors with a CCL
# that a (stand-in) adapter registers through the public torch.distributed.Backend.register_backend.
VENDOR_VALUES = {
    "hostgloo": {"ADAPTER": "torch", "DEVICE_TYPE": "cpu", "CCL_BACKEND": "gloo"},
    "regccl": {"ADAPTER": "torch_regccl", "DEVICE_TYPE": "cpu", "CCL_BACKEND": "regccl",
               "CCL_CREATOR": "torch_regccl:create_process_group"},
}
# The stand-in adapter: what a vendor's package does at import (register its backend), with a CCL
# that is gloo underneath (correct for strided tensors) under its own class and backend name, so the
# conformance report shows which group ran the collectives.
STAND_IN_ADAPTER = '''"""Stand-in for a vendor's PyTorch adapter: registers the `regccl` backend at import."""
import torch.distributed as dist

from hal.emulation.gloo_group import StridedSafeGloo


class RegCclGroup(StridedSafeGloo):
    def getBackendName(self):
        return "regccl"


def create_process_group(store, rank, world_size, timeout):
    return RegCclGroup(store, rank, world_size, timeout)


dist.Backend.register_backend("regccl", create_process_group, devices=["cpu"])
'''
PRIVATE_TORCH = re.compile(r"\b(?:torch|dist|distributed_c10d)\.(?:[A-Za-z]\w*\.)*_[A-Za-z]\w*|distributed_c10d")


def _set_values(module: Path, values: dict) -> None:
    """Edit the generated module as the doc says: one `NAME = "..."` line per value."""
    text = module.read_text()
    for name, value in values.items():
        text, n = re.subn(rf"(?m)^{name} = .*$", f"{name} = {value!r}", text)
        assert n == 1, f"the template has {n} assignments of {name}"
    module.write_text(text)


@pytest.fixture(scope="module")
def native_plugins(tmp_path_factory):
    root = tmp_path_factory.mktemp("native")
    site = root / "site"
    pkgs = []
    for name, values in VENDOR_VALUES.items():
        pkg = root / name
        assert hal_main(["new-plugin", name, "--dir", str(pkg)]) == 0
        _set_values(pkg / f"hal_{name}" / "__init__.py", values)
        pkgs.append(pkg)
    _run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
          "--no-build-isolation", "--target", site, *pkgs], cwd=root)
    (site / "torch_regccl.py").write_text(STAND_IN_ADAPTER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)}
    for var in ("HAL_PLUGINS", "HAL_DISABLE_PLUGIN_AUTOLOAD", "HAL_CHIP", "HAL_EMULATE", "HAL_CLUSTER"):
        env.pop(var, None)
    return root, env


def test_the_doc_names_every_value_the_test_sets():
    doc = DOC.read_text()
    for name in sorted({k for values in VENDOR_VALUES.values() for k in values}):
        assert f"`{name}`" in doc, f"docs/writing-a-plugin.md never tells a vendor to set {name}"


def test_template_uses_no_private_torch_api(native_plugins):
    root, _ = native_plugins
    for name in VENDOR_VALUES:
        code = (root / name / f"hal_{name}" / "__init__.py").read_text()
        assert PRIVATE_TORCH.findall(code) == [], name


# What each generated plugin runs: the levels its generated code decides. The template decides the
# contract hooks, the runtime (host tensors: CpuRuntime), the CCL (gloo's branch, or the creator that
# register_backend registered) with its capability matrix, and the group the perf level measures;
# both run those levels, with 2 ranks (collectives at world size 2: world sizes 3 and 4 are the
# fabric's, checked on cpu in test_conformance_plugins). The ops and errors levels would run the
# reference kernels and the stand-in's StridedSafeGloo, nothing generated (the vendor plugins run
# them there). regccl also joins the bridge (its group and cpu in one hetero group), on every
# collective in float32: the template's thin default matrix leaves the bridge to emulate the rest
# (the bridge level's every dtype runs on ascend there, the bridge itself in test_bridge_collectives).
CORE = ["contract.*", "runtime.*", "collectives.*", "perf.*"]
RUNS = {"hostgloo": ("contract,runtime,collectives,perf", CORE),
        "regccl": ("contract,runtime,collectives,bridge,perf", CORE + ["bridge.hetero_group", "bridge.*.float32*"])}


def test_native_host_plugins_pass_conformance(native_plugins):
    root, env = native_plugins
    procs = {}
    for name in VENDOR_VALUES:  # both at once: much of a run is waiting on worker start-up
        levels, select = RUNS[name]
        procs[name] = subprocess.Popen(
            [HAL, "conformance", "--plugin", name, "--level", levels, *(a for k in select for a in ("-k", k)),
             "--nproc", "2", "--json", root / f"{name}.json", "--efficiency", root / f"{name}-eff.json"],
            cwd=root, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    outs = {name: p.communicate(timeout=600)[0] for name, p in procs.items()}
    for name, p in procs.items():
        assert p.returncode == 0, f"{name}:\n{outs[name][-6000:]}"
        report = json.loads((root / f"{name}.json").read_text())
        assert report["emulated"] is False and report["summary"]["failed"] == 0
        assert set(report["levels"]) == set(RUNS[name][0].split(",")), (name, report["levels"])
        status = {c["id"]: c for c in report["checks"]}
        # the plugin's own group formed, and every combination was asked of it (declared: golden result;
        # undeclared: a typed refusal)
        assert status["runtime.process_group"]["status"] == "passed", status["runtime.process_group"]
        assert sum(i.startswith("collectives.") for i in status) > 400, (name, len(status))
        assert status["collectives.all_reduce.float32.sum"]["status"] == "passed"
        ccl = json.loads((root / f"{name}-eff.json").read_text())["ccl"]
        # the perf level's collectives ran on the plugin's own group
        assert ccl == {"hostgloo": "StridedSafeGloo", "regccl": "RegCclGroup"}[name], (name, ccl)
    bridge = {c["id"]: c for c in json.loads((root / "regccl.json").read_text())["checks"] if c["level"] == "bridge"}
    assert bridge["bridge.hetero_group"]["status"] == "passed" and "'regccl'" in bridge["bridge.hetero_group"]["message"]
    assert len(bridge) > 30 and all(c["status"] == "passed" for c in bridge.values()), bridge
    assert "2 on regccl" in bridge["bridge.all_reduce.float32.sum"]["message"]  # its own CCL carried the chip's part


def test_host_plugin_becomes_the_default_chip_with_a_warning(native_plugins):
    root, env = native_plugins
    env = {**env, "HAL_PLUGINS": "cpu,hostgloo"}
    proc = _run([HAL, "info", "--json"], env=env, cwd=root)
    acc = json.loads(proc.stdout)["accelerator"]
    assert acc["chip"] == "hostgloo" and "host tensors" in acc["selected_by"]
    assert "HostChipDefaultWarning" in proc.stderr and "HAL_CHIP=cpu" in proc.stderr
    assert proc.stderr.count("HostChipDefaultWarning") == 1
    proc = _run([HAL, "info", "--json"], env={**env, "HAL_CHIP": "cpu"}, cwd=root)
    assert json.loads(proc.stdout)["accelerator"]["chip"] == "cpu" and "HostChipDefaultWarning" not in proc.stderr


def test_a_vendor_measures_its_own_ccl(native_plugins):
    # The doc's recipe for `source`: measure the plugin's own native group (here regccl's) and paste
    # the printed matrix into hal_collective_capabilities. A small subset keeps the test short.
    root, env = native_plugins
    out = _run([sys.executable, "-m", "hal_cpu.measure_capabilities", "--plugin", "regccl", "--collectives",
                "all_reduce,broadcast", "--dtypes", "float32,int16", "--format", "python"], env=env, cwd=root).stdout
    from hal import sdk
    matrix = eval(out, {"sdk": sdk})  # the printed expression is what the plugin returns
    assert isinstance(matrix, sdk.CapabilityMatrix) and matrix.chip == "regccl"
    assert "--plugin regccl --collectives all_reduce,broadcast --dtypes float32,int16" in matrix.source
    assert "as RegCclGroup" in matrix.source
    # gloo (under the stand-in) has no int16 at all and no bitwise ops on floats (as hal/data's matrix says)
    assert matrix.entries == {("all_reduce", "float32", op) for op in ("sum", "avg", "max", "min", "product")} | \
        {("broadcast", "float32", "-")}
