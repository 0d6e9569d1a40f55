"""Level `ops`: every HAL op, as the chip dispatches it, against the CPU float64 golden.

`ops.<op>.<dtype>` runs the kernel the bound chip dispatches `<op>` to (the plugin's override if it
has one, else the HAL reference on the chip's device) on `hal.ops.golden`'s cases (odd sizes,
non-contiguous views, each op's options) plus this suite's empty and large cases, and compares with
`hal.ops.tolerances.tolerance(op, dtype)`. Where the plugin overrides `<op>`,
`ops.reference.<op>.<dtype>` also runs the HAL reference on the device, so a failure can be pinned
on the override or on the device's torch kernels. Dtypes are those of the tolerance table that the
chip's runtime supports.
"""
from __future__ import annotations

from ..checks import Check, CheckFailed, CheckSkipped, Passed
from ..target import Target

DTYPES = ("float32", "bfloat16", "float16", "float64")


def _cases(op: str, dtype, seed: int, large: bool):
    from hal.ops.golden import cases

    from .ops_edge_cases import edge_cases
    return cases(op, dtype, seed) + edge_cases(op, dtype, seed, large=large)


def check_op(ctx, op: str, dtype_name: str, reference: bool) -> Passed:
    import torch
    from hal.ops import golden
    from hal.ops.reference import KERNELS

    dtype = getattr(torch, dtype_name)
    if dtype not in ctx.acc.supported_dtypes():
        raise CheckSkipped(f"chip {ctx.acc.chip.name!r} does not list {dtype_name} in supported_dtypes()")
    if reference:
        fn, label = KERNELS[op], f"hal reference on {ctx.device}"
    else:
        kernel = ctx.acc.kernels[op]
        fn, label = kernel.fn, kernel.describe()
    results = [golden.check(fn, case, label, ctx.device) for case in _cases(op, dtype, ctx.spec.seed, True)]
    bad = [r for r in results if not r.ok]
    if bad:
        raise CheckFailed(f"{len(bad)} of {len(results)} cases outside tolerance (expected |out - golden| <= "
                          f"atol + rtol |golden| against the float64 golden): "
                          + "; ".join(r.describe() for r in bad))
    worst = max(results, key=lambda r: r.worst_ratio)
    return Passed(f"{len(results)} cases via {label}; worst err/allowed {worst.worst_ratio:.3g} "
                  f"(case {worst.case}, rtol {worst.rtol:.3g}, atol {worst.atol:.3g})")


def discover(target: Target) -> list[Check]:
    from hal.ops.kernel import OP_NAMES
    overridden = set(target.overrides())
    checks = []
    for op in OP_NAMES:
        for d in DTYPES:
            checks.append(Check(f"ops.{op}.{d}", "ops",
                                f"{op} in {d} as the chip dispatches it vs the float64 golden (tolerance table)",
                                check_op, (op, d, False)))
            if op in overridden:
                checks.append(Check(f"ops.reference.{op}.{d}", "ops",
                                    f"the HAL reference {op} in {d} on the chip's device vs the float64 golden",
                                    check_op, (op, d, True)))
    return checks
