"""`hal` imports only what it runs: `import hal.cli` and `hal --help` load no layer above hal, no plugin
and not torch; `hal info` loads plugins (it lists them) but no layer above hal and registers no
`hetero` backend; a chosen subcommand loads its own module only (and its --help no torch). Each case runs in a fresh
interpreter and reads its sys.modules (what `python -X importtime` would list)."""
import importlib
import json
import subprocess
import sys

import pytest

from hal.cli import SUBCOMMANDS

ABOVE_HAL = ("hal.ccl_bridge", "hal.conformance", "hal.strategies", "hal.trainer", "hal.testbed", "hal.bench",
             "benchmarks")
PLUGINS = ("hal_cpu", "hal_cuda", "hal_ascend", "hal_kunlun")

_PROBE = """
import json, sys
code = None
try:
    {body}
except SystemExit as exc:
    code = exc.code
mods = sorted(sys.modules)
hetero = False
if "torch.distributed" in sys.modules:
    hetero = "HETERO" in sys.modules["torch.distributed"].Backend._plugins
sys.stdout.flush()
sys.stderr.write("\\n@@" + json.dumps({{"modules": mods, "code": code, "hetero": hetero}}) + "\\n")
"""


def _loaded(body: str, env_extra: dict = None) -> dict:
    import os
    env = dict(os.environ, HAL_PLUGINS="", HAL_EMULATE="", HAL_CLUSTER="", HAL_CHIP="")
    env.update(env_extra or {})
    for k in ("HAL_PLUGINS", "HAL_EMULATE", "HAL_CLUSTER", "HAL_CHIP"):
        if not env[k]:
            env.pop(k)
    proc = subprocess.run([sys.executable, "-c", _PROBE.format(body=body)], capture_output=True, text=True,
                          timeout=120, env=env)
    marker = proc.stderr.rfind("@@")
    assert marker >= 0, f"probe did not finish (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    out = json.loads(proc.stderr[marker + 2:])
    out["stdout"] = proc.stdout
    return out


def _top(modules: list) -> set:
    return {m.split(".")[0] for m in modules}


def _above(modules: list, packages=ABOVE_HAL + PLUGINS) -> list:
    """The loaded modules that belong to one of `packages` (a package or any module under it)."""
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in packages))


def test_import_hal_cli_loads_nothing_above_hal_nor_torch():
    got = _loaded("import hal.cli")
    assert not _above(got["modules"]), _above(got["modules"])
    assert "torch" not in _top(got["modules"])


def test_hal_help_lists_every_subcommand_without_importing_any():
    got = _loaded("from hal.cli import main; main(['--help'])")
    assert got["code"] == 0
    assert not _above(got["modules"]), _above(got["modules"])
    assert "torch" not in _top(got["modules"])
    own = {module for module, _ in SUBCOMMANDS.values()}
    assert not own & set(got["modules"]), sorted(own & set(got["modules"]))
    for name, (_, help_text) in SUBCOMMANDS.items():
        assert name in got["stdout"], name
        assert help_text.split()[0] in got["stdout"], (name, help_text)


def test_hal_info_loads_plugins_but_nothing_above_hal():
    got = _loaded("from hal.cli import main; sys.exit(main(['info', '--json']))")
    assert got["code"] == 0
    info = json.loads(got["stdout"])
    assert {p["name"] for p in info["plugins"]} >= {"cpu", "cuda", "ascend", "kunlun"}
    assert not _above(got["modules"], ABOVE_HAL), _above(got["modules"], ABOVE_HAL)
    assert not got["hetero"], "hal info registered the hetero backend (it imported ccl_bridge)"


@pytest.mark.parametrize("argv, module", [(["demo", "--help"], "hal.cli.demo"),
                                          (["bench", "comm", "--help"], "hal.cli.bench"),
                                          (["conformance", "--help"], "hal.cli.conformance")])
def test_a_chosen_subcommand_imports_its_module_only(argv, module):
    got = _loaded(f"from hal.cli import main; main({argv!r})")
    assert got["code"] == 0
    own = {m for m, _ in SUBCOMMANDS.values()}
    assert own & set(got["modules"]) == {module}
    assert not _above(got["modules"], ("hal.ccl_bridge", "hal.strategies", "hal.trainer", "hal.testbed"))
    assert "torch" not in _top(got["modules"]), f"{argv}: --help imported torch"


def test_every_subcommand_module_has_the_interface():
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        assert callable(module.add_arguments) and callable(module.run), name
        assert module.__doc__, f"{module_name} has no docstring (its --help description)"
        assert help_text and "\n" not in help_text


def test_no_module_launches_a_strategies_module_by_name():
    """`hal` (and hal/cli/) start rank jobs by module name; none may name a module of a lower
    layer's package as an application: the demo's rank job lives in hal/cli/ with its launcher."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    for path in list((root / "hal").rglob("*.py")) + list((root / "commands").rglob("*.py")):
        text = path.read_text()
        assert '"-m", "strategies.' not in text and "-m strategies." not in text, path


def test_a_subcommand_whose_package_is_missing_says_so(monkeypatch, capsys):
    """A table entry whose package is not installed: one line naming the command and module, exit 2,
    and the other commands still work; a module that exists but fails on its own import is not hidden."""
    import hal.cli as cli
    monkeypatch.setitem(cli.SUBCOMMANDS, "nosuch", ("nosuchpkg_for_test.cli", "a command from a missing package"))
    assert cli.main(["nosuch", "--flag"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("hal: error: hal nosuch: its module nosuchpkg_for_test.cli is not installed (no module "
                           "'nosuchpkg_for_test'); install the package that provides it (`pip install -e .` in "
                           "this repository installs every layer)")
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0 and "a command from a missing package" in capsys.readouterr().out
    monkeypatch.setitem(cli.SUBCOMMANDS, "broken", ("tests._cli_broken_subcommand", "imports a missing dependency"))
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_for_test"):
        cli.main(["broken"])
