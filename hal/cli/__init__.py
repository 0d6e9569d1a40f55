"""The `hal` command: `hal info` and hal's own subcommands, and the subcommands of the layers above hal.

Every subcommand is named here by module path with a one-line help, and only the chosen one is
imported: `hal --help` lists them all from this table, importing none (nor torch), so `hal` imports no
layer above it (tests/test_cli_imports.py checks sys.modules). A subcommand module has
`add_arguments(parser)` and `run(args) -> int`; its docstring is its `--help` description. The
higher layers' commands live in hal/cli/ (bench, demo, conformance, plan, simulate, train) and
hal/testbed/; a subcommand whose package is not installed says so when chosen (exit 2).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Callable, Optional

# name -> (module, one-line help). Each module has `add_arguments(parser)` and `run(args) -> int`.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "info": ("hal.cli.info", "show the contract, plugins, chips and the bound accelerator"),
    "cluster": ("hal.cli.cluster", "validate a cluster spec and show its rank layout: `hal cluster show FILE`"),
    "ops-check": ("hal.cli.ops_check", "run every HAL op on every discovered chip (emulated) against the reference"),
    "new-plugin": ("hal.cli.new_plugin", "write a ready-to-install plugin package for a new chip"),
    "bench": ("hal.cli.bench", "benchmarks: `hal bench comm` prints an nccl-tests style table"),
    "demo": ("hal.cli.demo", "DDP over the hetero bridge on an emulated mixed cluster, checked against one process"),
    "train": ("hal.cli.train", "train a model on a (mixed) cluster from a TOML config: `hal train --config FILE`"),
    "export": ("hal.cli.export", "write a `hal train` checkpoint as a Hugging Face checkpoint: "
               "`hal export --hf OUT --run RUN_DIR`"),
    "conformance": ("hal.cli.conformance", "run the conformance suite against a plugin"),
    "plan": ("hal.cli.plan", "find the best layout of a model over a mixed cluster (cost model + simulator)"),
    "simulate": ("hal.cli.simulate", "predict one training step of a given plan"),
    "testbed": ("hal.cli.testbed", "multi-host test bed (root): hosts as namespaces, one shaped NIC per rank: "
                "up|run|exec|status|down"),
}

EXAMPLES = """examples:
  hal info --json
  HAL_EMULATE=ascend hal ops-check
  hal train --config examples/train/mixed.toml
  hal COMMAND --help            a subcommand's own options
"""


def epilog() -> str:
    """`hal --help`'s closing text: the environment section generated from hal.envs, then examples."""
    from hal import envs
    return envs.help_text() + "\n" + EXAMPLES


class MissingSubcommandError(Exception):
    """The chosen subcommand's package is not installed (or does not import); the message names both."""


def _chosen(argv: list[str]) -> Optional[str]:
    """The subcommand named in argv: the first argument that is not an option (hal's own options are
    only -h/--help, which take no value)."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg if arg in SUBCOMMANDS else None
    return None


def _load(name: str):
    module_name = SUBCOMMANDS[name][0]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise MissingSubcommandError(
                f"hal {name}: its module {module_name} is not installed (no module {exc.name!r}); install the "
                f"package that provides it (`pip install -e .` in this repository installs every layer)") from None
        raise


def build_parser(chosen: Optional[str] = None) -> tuple[argparse.ArgumentParser, dict[str, Callable]]:
    """The parser, with every subcommand listed from SUBCOMMANDS; only `chosen` (if any) is imported and
    given its arguments. Returns (parser, {chosen: its run}); `hal --help` passes chosen=None."""
    parser = argparse.ArgumentParser(
        prog="hal", description="Heterogeneous-accelerator abstraction layer: one contract for NVIDIA, "
        "Ascend and Kunlun chips (and yours), mixed in one torch.distributed job.",
        epilog=epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    runners: dict[str, Callable] = {}
    for name, (_, help_text) in SUBCOMMANDS.items():
        if name != chosen:
            sub.add_parser(name, help=help_text, description=help_text)
            continue
        module = _load(name)
        p = sub.add_parser(name, help=help_text, description=(module.__doc__ or help_text).strip(),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(p)
        runners[name] = module.run
    return parser, runners


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        parser, runners = build_parser(_chosen(argv))
    except MissingSubcommandError as exc:
        print(f"hal: error: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 0
    from hal.contract.errors import HalError
    try:
        return int(runners[args.command](args) or 0)
    except HalError as exc:
        print(f"hal {args.command}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: the launched job was stopped first (hal.launch.watchdog)
        print(f"hal {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `hal ... | head`: the reader left. Point stdout at /dev/null so the interpreter's final flush
        # does not raise again (the recipe of Python's signal docs), and exit as a SIGPIPE'd tool does.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, default=str))


if __name__ == "__main__":
    sys.exit(main())
