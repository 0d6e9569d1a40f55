"""Show the contract version, the plugins found (and where from), every chip, and the bound accelerator.

Text by default; `--json` prints the machine-readable form:
{"contract_version", "plugins": [{"name", "version", "contract_version", "distribution", "chips"}],
 "chips": [{"name", "torch_device_type", "ccl_backend", "native", "emulated", ...}], "accelerator": {...}}
"""
from __future__ import annotations

import argparse

from hal.contract.version import CONTRACT_VERSION
from hal.contract.errors import HalError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--no-bind", action="store_true", help="do not bind an accelerator (just list plugins and chips)")


def collect(bind: bool = True) -> dict:
    from hal.core.selection import accelerator
    from hal.core.plugin_manager import get_plugin_manager
    pm = get_plugin_manager()
    chips = []
    for name, (spec, plugin) in sorted(pm.chips.items()):
        native = pm.native_available(name)
        # A chip that is not natively here runs emulated; `emulated` says whether it would be.
        chips.append({"name": name, "plugin": plugin, "vendor": spec.vendor,
                      "torch_device_type": spec.torch_device_type, "ccl_backend": spec.ccl_backend,
                      "ccl_name": spec.ccl_name, "visible_devices_env": spec.visible_devices_env,
                      "native": native, "emulated": not native, "emulatable": True,
                      "profile_model": pm.profile(name).model})
    acc: dict = {}
    if bind:
        try:
            acc = accelerator().describe()
        except HalError as exc:
            acc = {"error": f"{type(exc).__name__}: {exc}"}
    return {"contract_version": CONTRACT_VERSION,
            "plugins": [rec.describe() for rec in pm.plugins.values()],
            "chips": chips, "accelerator": acc}


def run(args: argparse.Namespace) -> int:
    data = collect(bind=not args.no_bind)
    # Exit 2 when the accelerator cannot be selected (the environment is wrong), after showing everything.
    code = 2 if "error" in data["accelerator"] else 0
    if args.json:
        from hal.cli import print_json
        print_json(data)
        return code
    print(f"HAL contract {data['contract_version']}")
    print(f"plugins ({len(data['plugins'])}):")
    for p in data["plugins"]:
        print(f"  {p['name']:<10} {p['version']:<8} contract {p['contract_version']:<5} "
              f"chips {','.join(p['chips']) or '-':<16} from {p['distribution'] or '(registered in process)'}")
    print(f"chips ({len(data['chips'])}):")
    print(f"  {'chip':<10} {'torch device':<13} {'ccl':<8} {'native':<7} {'emulated':<9} profile")
    for c in data["chips"]:
        print(f"  {c['name']:<10} {c['torch_device_type']:<13} {c['ccl_backend']:<8} "
              f"{'yes' if c['native'] else 'no':<7} {'yes' if c['emulated'] else 'no':<9} {c['profile_model']}")
    a = data["accelerator"]
    if a:
        if "error" in a:
            print(f"accelerator: {a['error']}")
            import sys
            print(f"hal info: error: the accelerator cannot be selected: {a['error']}", file=sys.stderr)
        else:
            tag = "EMULATED" if a["emulated"] else "native"
            print(f"accelerator: {a['chip']} ({tag}) on {a['device']}, plugin {a['plugin']}, "
                  f"selected by {a['selected_by']}")
    return code
