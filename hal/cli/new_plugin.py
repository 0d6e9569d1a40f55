"""Write a ready-to-install plugin package for a new chip: `hal new-plugin NAME [--dir D]`.

The package (D, default ./hal-NAME) holds:
  pyproject.toml                 entry point NAME = "hal_NAME" in group `hal.plugins`
  hal_NAME/__init__.py           the chip as one hal.sdk.Chip subclass (every hook through
                                 sdk.plugin); runs emulated (CPU tensors) until the vendor's PyTorch
                                 adapter is installed
  tests/test_conformance.py      runs the conformance suite on it (`pytest -p hal.conformance --hal-plugin NAME`)
  README.md
Then:
  pip install D && hal info      # lists chip NAME: native no, emulated yes
  HAL_EMULATE=NAME hal ops-check # the HAL op tests on the emulated chip
To make it native, set VENDOR, ADAPTER, DEVICE_TYPE, CCL_BACKEND and CCL_CREATOR at the top of
hal_NAME/__init__.py (docs/writing-a-plugin.md, "The values you set").
NAME must be a lowercase identifier (the chip name, e.g. `acme`) that no installed plugin uses.

`hal new-plugin NAME --addon CHIP` writes an add-on instead: a package that declares no chip and
ships kernels for CHIP (an installed chip, e.g. cpu or cuda) at a priority above its owner's; its test
certifies it with `hal conformance --plugin hal_NAME --chip CHIP`.
"""
from __future__ import annotations

import argparse
import importlib.util
import keyword
import re
import sys
from importlib import resources
from pathlib import Path
from typing import Optional

TEMPLATE_DIR = ("templates", "plugin")
ADDON_TEMPLATE_DIR = ("templates", "addon")
NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


class NewPluginError(Exception):
    """A name or target directory `hal new-plugin` cannot use; the message says which and why."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="chip name: lowercase letters, digits and _ (e.g. acme)")
    p.add_argument("--dir", default=None, metavar="D",
                   help="where to write the package (default ./hal-NAME); must be absent or empty")
    p.add_argument("--addon", default=None, metavar="CHIP",
                   help="write a kernel add-on for an installed chip CHIP (declares no chip) instead of a chip plugin")


def check_name(name: str, installed_chips: Optional[dict[str, str]] = None) -> None:
    """Refuse names that are not a chip name or that an installed plugin already uses."""
    if not NAME_RE.match(name) or keyword.iskeyword(name):
        raise NewPluginError(f"NAME {name!r} is not a valid chip name: use 1-32 lowercase letters, digits "
                             f"and '_', starting with a letter, not a Python keyword (e.g. 'acme')")
    if installed_chips and name in installed_chips:
        raise NewPluginError(f"NAME {name!r}: chip {name!r} is already provided by installed plugin "
                             f"{installed_chips[name]!r}; choose another name")
    try:
        taken = importlib.util.find_spec(f"hal_{name}") is not None
    except (ImportError, ValueError):
        taken = False
    if taken:
        raise NewPluginError(f"NAME {name!r}: a Python package 'hal_{name}' is already importable; choose another name")


def check_target(target: Path) -> None:
    if target.exists() and not target.is_dir():
        raise NewPluginError(f"--dir {target}: exists and is not a directory")
    if target.is_dir() and any(target.iterdir()):
        raise NewPluginError(f"--dir {target}: exists and is not empty; give a new or empty directory")


def render(name: str, target: Path, addon: Optional[str] = None) -> list[Path]:
    """Write the package for chip `name` (or, with `addon`, the add-on `name` for chip `addon`) into
    `target`; returns the files written."""
    from hal import __version__
    from hal.contract.version import CONTRACT_VERSION
    package = f"hal_{name}"
    tokens = {"@@name@@": name, "@@NAME@@": name.upper(), "@@package@@": package,
              "@@Class@@": "".join(part.capitalize() for part in name.split("_")),
              "@@dist@@": f"hal-{name.replace('_', '-')}", "@@hal_version@@": __version__,
              "@@contract@@": CONTRACT_VERSION, "@@chip@@": addon or name}
    root = resources.files("hal").joinpath(*(ADDON_TEMPLATE_DIR if addon else TEMPLATE_DIR))
    written: list[Path] = []

    def walk(node, rel: tuple[str, ...]) -> None:
        for item in sorted(node.iterdir(), key=lambda t: t.name):
            if item.is_dir():
                walk(item, rel + (package if item.name == "package" else item.name,))
            elif item.name.endswith(".tmpl"):
                text = item.read_text(encoding="utf-8")
                for token, value in tokens.items():
                    text = text.replace(token, value)
                out = target.joinpath(*rel, item.name[: -len(".tmpl")])
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(text, encoding="utf-8")
                written.append(out)

    walk(root, ())
    return written


def _installed_chips() -> dict[str, str]:
    """chip -> plugin of what is installed now (empty if plugins cannot be loaded: not our concern here)."""
    try:
        from hal.core.plugin_manager import get_plugin_manager
        pm = get_plugin_manager()
        return {chip: plugin for chip, (_, plugin) in pm.chips.items()}
    except Exception:
        return {}


def run(args: argparse.Namespace) -> int:
    target = Path(args.dir if args.dir else f"hal-{args.name.replace('_', '-')}").resolve()
    installed = _installed_chips()
    try:
        check_name(args.name, installed)
        check_target(target)
        if args.addon is not None and args.addon not in installed:
            raise NewPluginError(f"--addon {args.addon!r}: no installed plugin declares chip {args.addon!r} "
                                 f"(installed chips: {sorted(installed)})")
        files = render(args.name, target, addon=args.addon)
    except NewPluginError as exc:
        print(f"hal new-plugin: error: {exc}", file=sys.stderr)
        return 2
    if args.addon is not None:
        print(f"wrote add-on package {args.name!r} (kernels for chip {args.addon!r}) in {target}:")
        for f in files:
            print(f"  {f.relative_to(target)}")
        print(f"next:\n  pip install -e '{target}[test]'\n  hal conformance --plugin hal_{args.name} "
              f"--chip {args.addon} [--emulate]\n  pytest {target / 'tests'}")
        return 0
    print(f"wrote plugin package for chip {args.name!r} in {target}:")
    for f in files:
        print(f"  {f.relative_to(target)}")
    print(f"next:\n  pip install {target}\n  hal info\n  HAL_EMULATE={args.name} hal ops-check\n"
          f"  pytest {target / 'tests'}\n"
          f"to run natively: set VENDOR, ADAPTER, DEVICE_TYPE, CCL_BACKEND, CCL_CREATOR in "
          f"{target / f'hal_{args.name}' / '__init__.py'} (docs/writing-a-plugin.md, 'The values you set')")
    return 0
