"""The plugin-only install path (docs/writing-a-plugin.md, "Installing hal without a compiler"):
`HAL_BUILD_SHM=0` builds hetero-hal with no C++ compiler, and that install works without the fabric.

What runs, for real: a wheel is built from a copy of this checkout's packaging and sources with
HAL_BUILD_SHM=0 and CC/CXX pointing at `false` (so any compiler call would fail the build), pip
installs it into a temporary folder, and a fresh interpreter with that folder first on sys.path (not
this checkout) imports hal, finds `hal.emulation.shm.available()` False with a reason naming HAL_BUILD_SHM and
how to get the fabric, gets a typed `ShmSetupError` asking for an shm group, and runs a 2-rank
all_reduce over the CPU fabric that HAL_CPU_CCL=auto picks (gloo). Second test: the same
build without the switch calls the compiler (and so fails with CC=false): the switch, not chance, makes
the first wheel compiler-free. What is not run here: a machine with no compiler at all, and a complete
default build (about a minute of g++; this checkout's own install is that build, and tests/test_shm.py
tests its result). pip runs offline
(--no-build-isolation, --no-deps): setuptools and wheel come from this venv.
"""
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# what the build reads: packaging and the hal + plugin sources (the other packages are not needed
# by a plugin vendor's install and would only slow the copy)
COPY = ("pyproject.toml", "setup.py", "README.md", "hal", "plugins", "csrc")


def _copy_tree(dst: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.pyc", "*.egg-info", "build")
    for name in COPY:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=ignore)
        else:
            shutil.copy2(src, dst / name)


def test_wheel_without_compiler_installs_and_falls_back_to_gloo(tmp_path):
    src, wheels, target, probe = (tmp_path / d for d in ("src", "wheels", "site", "probe"))
    src.mkdir()
    _copy_tree(src)
    env = dict(os.environ, HAL_BUILD_SHM="0", CC="false", CXX="false", PIP_NO_INPUT="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(wheels), str(src)], env=env, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    wheel, = wheels.glob("hetero_hal-*.whl")
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name  # pure Python: nothing compiled
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.endswith((".so", ".pyd"))]
    assert "hal/emulation/shm/__init__.py" in names and "hal/data/catalog/cuda.toml" in names and "hal_cpu/__init__.py" in names
    # one namespace: the wheel installs hal and the hal_* plugins, no generic top-level package
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"hal", "hal_cpu", "hal_cuda", "hal_ascend", "hal_kunlun"}, tops

    inst = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                           "--target", str(target), str(wheel)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert inst.returncode == 0, inst.stdout[-3000:] + inst.stderr[-3000:]

    probe.mkdir()
    shutil.copy2(ROOT / "tests" / "_no_shm_probe.py", probe / "_no_shm_probe.py")
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    # the installed copy's plugin, by module: the checkout's editable install declares the same
    # entry points, and both distributions are visible to importlib.metadata here
    run_env.update(PYTHONPATH=f"{target}{os.pathsep}{probe}", HAL_PLUGINS="hal_cpu", HAL_CPU_CCL="auto")
    run = subprocess.run([sys.executable, "-c", "import _no_shm_probe as p; p.main()"], cwd=tmp_path,
                         env=run_env, capture_output=True, text=True, timeout=240)
    line = next((ln for ln in run.stdout.splitlines() if ln.startswith("@@")), None)
    assert run.returncode == 0 and line, run.stdout[-3000:] + run.stderr[-3000:]
    got = json.loads(line[2:])
    assert Path(got["hal_file"]).is_relative_to(target), got["hal_file"]  # the wheel's hal, not the checkout
    ok, why = got["available"]
    assert ok is False and "HAL_BUILD_SHM=0" in why and "C++17 compiler" in why, why
    assert got["shm_error"].startswith("ShmSetupError: ") and "HAL_BUILD_SHM" in got["shm_error"], got["shm_error"]
    assert [r["group"] for r in got["ranks"]] == ["StridedSafeGloo", "StridedSafeGloo"], got["ranks"]
    assert [r["sum"] for r in got["ranks"]] == [3.0, 3.0]
    assert got["chip"] == "cpu"
    _core_commands_without_train_extra(target, tmp_path, run_env)


# rich and matplotlib are the [train] extra: a core install must run hal info and hal conformance
# without them. This finder makes importing either fail as it would where they are not installed.
_NO_TRAIN_EXTRA = """
import sys
class _Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("rich", "matplotlib"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _Missing())
import hal.cli
for argv in ARGVS:  # one interpreter runs the commands one after another, as hal's entry does each
    rc = hal.cli.main(argv)
    assert rc == 0, f"hal {' '.join(argv)} exited {rc}"
assert not [m for m in sys.modules if m.split(".")[0] in ("rich", "matplotlib")]
"""
_CORE_COMMANDS = [["info"], ["conformance", "--plugin", "cpu", "--level", "contract,ops", "-k", "matmul"]]


def _core_commands_without_train_extra(target: Path, cwd: Path, env: dict) -> None:
    script = f"ARGVS = {_CORE_COMMANDS!r}\n" + _NO_TRAIN_EXTRA
    run = subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=240)
    assert run.returncode == 0, f"hal {_CORE_COMMANDS}: " + run.stdout[-3000:] + run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    assert "PASSED" in run.stdout, run.stdout[-3000:]  # the conformance run's verdict line



def test_default_build_compiles_the_fabric(tmp_path):
    """Without HAL_BUILD_SHM=0 the wheel build compiles csrc/ into hal.emulation.shm._shm: with CC/CXX = `false`
    it stops at the first compile. pip's build isolation provides pybind11 (from the configured index);
    where no index answers, the test is skipped and says so."""
    src = tmp_path / "src"
    src.mkdir()
    _copy_tree(src)
    env = {k: v for k, v in os.environ.items() if k != "HAL_BUILD_SHM"}
    env.update(CC="false", CXX="false", PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path / "wheels"),
                            str(src)], env=env, capture_output=True, text=True, timeout=300)
    text = build.stdout + build.stderr
    if "No matching distribution found" in text or "Could not find a version" in text:
        pytest.skip("pip could not fetch the build requirements (setuptools, pybind11) for an isolated build")
    assert build.returncode != 0, "the default build succeeded with CC=false: it compiled nothing"
    assert "csrc/shm_" in text and "false " in text, text[-3000:]
