"""Run the conformance suite against a plugin: check by check, is it right, and how fast is the chip.

    hal conformance --plugin cpu --level all
    hal conformance --plugin cuda --emulate --level core,collectives --json out.json --report out.md
    hal conformance --plugin acme_hal --level ops -k rms_norm --junitxml junit.xml

Levels: contract, runtime, ops, collectives, bridge, errors, perf (`core` = contract, runtime, ops,
errors; `all` = every level). Exit code 0 only if no selected check failed (skipped checks are listed
with their reasons; --fail-on-skip makes them fail the run too), 1 if one failed, 2 if the suite
could not start (unknown plugin or chip, a chip neither native nor --emulate). The same checks run
under pytest: `pytest -p hal.conformance --hal-plugin NAME [-k EXPR]`.
"""
from __future__ import annotations

import argparse
import sys

from hal.conformance.checks import LEVELS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plugin", required=True,
                   help="the plugin under test: an entry-point name of group hal.plugins, or a module path")
    p.add_argument("--chip", help="which of the plugin's chips (default: its first); for an add-on (a plugin that "
                                  "declares no chip: kernels, wrappers) the chip to certify it on, whose owner "
                                  "is loaded with it")
    p.add_argument("--emulate", action="store_true", help="run the chip emulated on the CPU (labelled EMULATED)")
    p.add_argument("--level", default=None,
                   help=f"comma-separated levels from {', '.join(LEVELS)}, or core / all (default all; for an "
                        f"add-on contract,ops: the chip's other levels certify its owner)")
    p.add_argument("-k", "--select", action="append", default=None, metavar="PATTERN",
                   help="run only checks whose id matches this glob or substring (repeatable)")
    p.add_argument("--nproc", type=int, default=None,
                   help="ranks for the multi-process levels; collectives run at world sizes 2, 3, 4 and N up to "
                        "it (default 4 where ranks share the host: cpu and emulated chips; else 2)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds a collective may take before the chip's group must raise (default 60)")
    p.add_argument("--json", metavar="FILE", help="write the JSON report here")
    p.add_argument("--report", metavar="FILE", help="write the human report here (.md Markdown, .html HTML)")
    p.add_argument("--junitxml", metavar="FILE", help="write JUnit XML here")
    p.add_argument("--efficiency", metavar="FILE", help="write the efficiency matrix JSON here (perf level)")
    p.add_argument("--list", action="store_true", help="list the selected check ids with what each verifies")
    p.add_argument("--fail-on-skip", action="store_true", help="exit 1 if any selected check was skipped")
    p.add_argument("-v", "--verbose", action="store_true", help="print every result as it comes")


def _check_flags(args: argparse.Namespace) -> dict:
    """--plugin, --nproc, --timeout and every output path, checked up front (one line, exit 2)."""
    from importlib import metadata, util

    from hal.launch.check import MAX_LOCAL_RANKS, LaunchError, check_float, check_int, check_output_path
    if args.nproc is not None:
        check_int("--nproc", args.nproc, 1, MAX_LOCAL_RANKS)
    check_float("--timeout", args.timeout, 0.0, 86_400.0)
    eps = sorted(ep.name for ep in metadata.entry_points(group="hal.plugins"))
    try:
        importable = args.plugin in eps or util.find_spec(args.plugin) is not None
    except (ImportError, ValueError):
        importable = False
    if not importable:
        raise LaunchError(f"--plugin {args.plugin}: neither an installed plugin (entry points of group "
                          f"'hal.plugins': {eps}) nor an importable module")
    out = {}
    for flag, suffixes in (("json", (".json",)), ("report", (".md", ".html")), ("junitxml", (".xml",)),
                           ("efficiency", (".json",))):
        path = check_output_path(f"--{flag}", getattr(args, flag), suffixes)
        if path:
            setattr(args, flag, path)
            out[flag] = path
    return out


def _addon_levels(target, level_flag, levels: list) -> list:
    """An add-on runs contract and ops unless --level says otherwise: the chip's other levels certify
    its owner, which is tested on its own."""
    if not target.is_addon or level_flag is not None:
        return levels
    print(f"hal conformance: {target.plugin_name} is an add-on (declares no chip): levels contract,ops on chip "
          f"{target.chip} with its owner {target.owner} loaded (the chip's own levels certify the owner: "
          f"hal conformance --plugin {target.owner}; --level runs others on the pair)", flush=True)
    return ["contract", "ops"]


def run(args: argparse.Namespace) -> int:
    from hal.conformance.checks import parse_levels
    from hal.conformance.suite import discover, run_suite
    from hal.conformance.target import load_target
    try:
        levels = parse_levels(args.level or "all")
    except ValueError as exc:
        print(f"hal conformance: error: {exc}", file=sys.stderr)
        return 2
    from hal.contract.errors import HalError
    from hal.launch.check import fail
    try:
        outputs = _check_flags(args)  # before any plugin is loaded or rank started (hal.launch.check)
    except HalError as exc:
        return fail("hal conformance", exc)
    from hal.conformance.bounds import hard_bound
    from hal.conformance.target import default_nproc
    target = load_target(args.plugin, chip=args.chip, emulate=args.emulate, nproc=args.nproc or 2,
                         group_timeout_s=args.timeout)
    if args.nproc is None:
        target.nproc = default_nproc(target)
    levels = _addon_levels(target, args.level, levels)
    if args.select and not discover(target, levels, args.select):
        return fail("hal conformance", ValueError(
            f"-k {' -k '.join(args.select)}: matches no check in levels {','.join(levels)} "
            f"(`hal conformance --plugin {args.plugin} --list` shows the ids)"))
    if args.list:
        try:
            for c in discover(target, levels, args.select):
                print(f"{c.id:<58} {c.doc}")
            sys.stdout.flush()
        except BrokenPipeError:  # `--list | head`: the reader has all it wanted
            sys.stdout = None
        return 0

    def show(res) -> None:
        if args.verbose or res.status == "failed":
            print(f"  {res.status.upper():<7} {res.id} ({res.duration_s:.2f} s): {res.message}", flush=True)

    tag = "EMULATED" if target.emulated else "native"
    from hal import envs
    ignored = [f"{v.name}={v.text()}" for v in (envs.HAL_EMULATE, envs.HAL_CLUSTER, envs.HAL_CHIP,
                                                           envs.HAL_PLUGINS) if v.is_set()]
    if ignored:  # the suite binds the plugin under test itself; say so rather than seem to obey them
        print(f"hal conformance: note: {', '.join(ignored)} ignored here: the suite tests --plugin "
              f"{args.plugin} (--chip, --emulate choose its chip and emulation)", flush=True)
    print(f"hal conformance: plugin {target.plugin_name}, chip {target.chip} ({tag}), levels "
          f"{','.join(levels)}, {target.nproc} rank(s) ("
          + (f"collectives at world sizes {', '.join(map(str, target.world_sizes))}" if target.world_sizes
             else "multi-rank checks skipped: they need --nproc >= 2")
          + f"); ends within {hard_bound(levels, args.timeout) / 60:.0f} min "
          f"whatever the plugin does", flush=True)
    report = run_suite(target, levels, args.select, on_result=show)
    if args.json:
        report.write_json(args.json)
    if args.report:
        report.write_human(args.report)
    if args.junitxml:
        report.write_junit(args.junitxml)
    if args.efficiency:
        if report.efficiency_matrix is None:
            print("hal conformance: no efficiency matrix (the perf level did not run or produced no figures); "
                  f"{args.efficiency} not written", file=sys.stderr)
        else:
            report.efficiency_matrix.write(args.efficiency)
    print(report.console())
    for flag, path in outputs.items():
        if getattr(args, flag) and (flag != "efficiency" or report.efficiency_matrix is not None):
            print(f"hal conformance: --{flag} written to {path}")
    if not outputs:
        print("hal conformance: no report file written (--report FILE.md|.html or --json FILE.json keeps one)")
    if not report.ok:
        return 1
    if args.fail_on_skip and report.summary["skipped"]:
        print(f"hal conformance: exit code 1: --fail-on-skip and {report.summary['skipped']} check(s) skipped "
              f"(reasons above)")
        return 1
    return 0
