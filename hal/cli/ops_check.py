"""Check every HAL op on every discovered chip against the float64 golden.

`cpu` runs natively; every other registered chip runs EMULATED: its identity and profile, the kernels
its plugins offer for CPU tensors, on the host. Each op runs on small inputs (odd sizes, non-contiguous
views, every option: masks, ignore_index, gelu tanh, ...) in each dtype, through `hal.ops` exactly as
training code calls it, and is compared with the reference kernel run in float64 on the same inputs.
An op passes when every element is within atol + rtol |golden| (the table in hal.ops.tolerances,
derived from each dtype's unit roundoff).

The table shows, per chip, op and dtype: the largest absolute error, the worst error as a fraction
of what the tolerance allows (PASS when <= 1), and the kernel `hal.ops` dispatched to.
Exit status 1 if any check fails, 2 on a usage error (e.g. an unknown chip).
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

from hal.contract.kernel import OP_NAMES
from hal.ops.tolerances import DTYPES as TOLERANCE_DTYPES

DEFAULT_DTYPES = ("float32", "float16", "bfloat16")


@dataclass
class OpRow:
    """One op x dtype on one chip: the worst of its cases."""

    op: str
    dtype: str
    kernel: str
    cases: int
    max_abs_err: float
    worst_ratio: float
    rtol: float
    atol: float
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


@dataclass
class ChipReport:
    chip: str
    plugin: str
    emulated: bool
    rows: list[OpRow] = field(default_factory=list)

    @property
    def label(self) -> str:
        return "EMULATED" if self.emulated else "native"

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)


def _split(values: Optional[Sequence[str]]) -> list[str]:
    return [v.strip() for item in (values or []) for v in item.split(",") if v.strip()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chips", action="append", metavar="A,B",
                   help="only these chips (default: the chips HAL_EMULATE names, else every registered chip)")
    p.add_argument("--dtype", action="append", metavar="D[,D]",
                   help=f"dtypes to check, from {', '.join(TOLERANCE_DTYPES)} (default: {','.join(DEFAULT_DTYPES)})")
    p.add_argument("--ops", action="append", metavar="OP[,OP]", help="only these ops (default: all)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")


def check_chip(chip: str, emulated: bool, dtypes: Sequence[str], ops: Sequence[str]) -> ChipReport:
    """Bind `chip` and check `ops` in `dtypes` through hal.ops. Leaves the chip bound."""
    import torch

    from hal import ops as hal_ops
    from hal.core.selection import bind
    from hal.ops import golden

    acc = bind(chip, emulated=emulated)
    report = ChipReport(chip, acc.plugin, acc.emulated)
    for op in ops:
        kernel = acc.kernels[op].describe()
        fn = getattr(hal_ops, op)
        for dt in dtypes:
            results = golden.check_op(fn, op, getattr(torch, dt), kernel, device=acc.device)
            report.rows.append(OpRow(
                op, dt, kernel, len(results), max(r.max_abs_err for r in results),
                max(r.worst_ratio for r in results), results[0].rtol, results[0].atol,
                [f"case {r.case}: {r.problem or f'max|err| {r.max_abs_err:.3g}, err/allowed {r.worst_ratio:.3g}'}"
                 for r in results if not r.ok]))
    return report


def run_checks(chips: Optional[Iterable[str]] = None, dtypes: Sequence[str] = DEFAULT_DTYPES,
               ops: Sequence[str] = OP_NAMES) -> list[ChipReport]:
    """`cpu` natively (if asked for) and every other chip emulated. Resets the binding afterwards."""
    from hal.core.selection import reset
    from hal.contract.errors import UnknownOpError
    from hal.core.plugin_manager import get_plugin_manager

    pm = get_plugin_manager()
    names = list(chips) if chips else sorted(pm.chips, key=lambda c: (c != "cpu", c))
    for name in names:
        pm.chip(name)  # UnknownChipError lists the known chips
    bad_ops = [o for o in ops if o not in OP_NAMES]
    if bad_ops:
        raise UnknownOpError(f"unknown ops {bad_ops}; HAL ops are {list(OP_NAMES)}")
    bad_dtypes = [d for d in dtypes if d not in TOLERANCE_DTYPES]
    if bad_dtypes:
        raise ValueError(f"no tolerance for dtypes {bad_dtypes}; choose from {list(TOLERANCE_DTYPES)}")
    try:
        return [check_chip(name, name != "cpu", dtypes, ops) for name in names]
    finally:
        reset()


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.2e}"


def format_table(reports: Sequence[ChipReport], dtypes: Sequence[str]) -> str:
    lines = [f"HAL ops check: {len(OP_NAMES)} ops x {','.join(dtypes)} vs the float64 golden "
             f"(tolerances: hal.ops.tolerances)"]
    for rep in reports:
        lines.append("")
        lines.append(f"chip {rep.chip} ({rep.label}, plugin {rep.plugin})")
        lines.append(f"  {'op':<29} {'dtype':<9} {'cases':>5} {'max|err|':>9} {'rtol':>9} {'err/tol':>8}  "
                     f"{'result':<6} kernel")
        for r in rep.rows:
            lines.append(f"  {r.op:<29} {r.dtype:<9} {r.cases:>5} {_fmt(r.max_abs_err):>9} {_fmt(r.rtol):>9} "
                         f"{r.worst_ratio if math.isfinite(r.worst_ratio) else math.inf:>8.3f}  "
                         f"{'PASS' if r.ok else 'FAIL':<6} {r.kernel}")
            for f in r.failures:
                lines.append(f"      FAIL {f}")
    checks = sum(len(r.rows) for r in reports)
    failed = sum(not row.ok for r in reports for row in r.rows)
    emulated = [r.chip for r in reports if r.emulated]
    lines.append("")
    lines.append(f"summary: {len(reports)} chip(s) ({len(emulated)} EMULATED: {', '.join(emulated) or '-'}), "
                 f"{checks} op x dtype checks, {failed} failed")
    return "\n".join(lines)


def to_json(reports: Sequence[ChipReport], dtypes: Sequence[str]) -> dict:
    def num(x: float):
        return x if math.isfinite(x) else None  # JSON has no Infinity; a problem is in `failures`
    return {"dtypes": list(dtypes), "ok": all(r.ok for r in reports),
            "chips": [{"chip": r.chip, "plugin": r.plugin, "emulated": r.emulated, "ok": r.ok,
                       "results": [{"op": x.op, "dtype": x.dtype, "kernel": x.kernel, "cases": x.cases,
                                    "max_abs_err": num(x.max_abs_err), "worst_ratio": num(x.worst_ratio),
                                    "rtol": x.rtol, "atol": x.atol, "ok": x.ok, "failures": x.failures}
                                   for x in r.rows]} for r in reports]}


def _env_chips() -> Optional[list[str]]:
    """Without --chips, the chips `HAL_EMULATE` names (the README's `HAL_EMULATE=ascend hal ops-check`
    checks ascend only); None (every chip) when it is unset."""
    from hal import envs
    text = envs.HAL_EMULATE.text()
    if not text:
        return None
    from hal.emulation.emulate import chips_in_map
    return list(dict.fromkeys(chips_in_map(text)))  # ChipSelectionError names a bad map


def run(args: argparse.Namespace) -> int:
    dtypes = _split(args.dtype) or list(DEFAULT_DTYPES)
    bad = [d for d in dtypes if d not in TOLERANCE_DTYPES]
    if bad:
        from hal.contract.errors import HalError
        raise HalError(f"--dtype {','.join(bad)}: no tolerance for it; choose from {list(TOLERANCE_DTYPES)}")
    reports = run_checks(_split(args.chips) or _env_chips(), dtypes, _split(args.ops) or OP_NAMES)
    if args.json:
        from hal.cli import print_json
        print_json(to_json(reports, dtypes))
    else:
        print(format_table(reports, dtypes))
    return 0 if all(r.ok for r in reports) else 1
