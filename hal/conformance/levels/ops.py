"""Level `ops`: every HAL op, as the chip dispatches it, against the CPU float64 golden.

`ops.<op>.<dtype>` runs the kernel the bound chip dispatches `<op>` to (the plugin's override if it
has one, else the HAL reference on the chip's device) on `hal.ops.golden`'s cases (odd sizes,
non-contiguous views, each op's options) plus this suite's empty, large and whole-range cases, and
compares with `hal.ops.tolerances.tolerance(op, dtype)`. Every case also checks the op contract
(`contract_problem`): inputs unchanged, the output on the chip's device, dense, contiguous when the
inputs are, sharing no storage with an input, and a gather bit-exact. Where the plugin overrides `<op>`,
`ops.reference.<op>.<dtype>` also runs the HAL reference on the device, so a failure can be pinned
on the override or on the device's torch kernels. Dtypes are those of the tolerance table that the
chip's runtime supports. `ops.refusals.<op>` runs the op's refusal table (`ops_refusals.py`: out-of-range
indices, shape/dtype mismatches, bad options, NaN/inf): the kernel raises where the reference raises.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from ..checks import Check, CheckFailed, CheckNotApplicable, Passed
from ..target import Target
from .addon import addon_kernel
from .ops_refusals import check_refusals

DTYPES = ("float32", "bfloat16", "float16", "float64")


def _cases(op: str, dtype, seed: int, large: bool):
    from hal.ops.golden import cases

    from .ops_edge_cases import edge_cases
    return cases(op, dtype, seed) + edge_cases(op, dtype, seed, large=large)


def check_op(ctx, op: str, dtype_name: str, reference: bool, addon: bool = False) -> Passed:
    import torch
    from hal.ops.reference import KERNELS

    dtype = getattr(torch, dtype_name)
    if dtype not in ctx.acc.supported_dtypes():
        raise CheckNotApplicable(f"chip {ctx.acc.chip.name!r} does not list {dtype_name} in supported_dtypes()")
    if reference:
        fn, label = KERNELS[op], f"hal reference on {ctx.device}"
    else:
        kernel = addon_kernel(ctx, op) if addon else ctx.acc.kernels[op]
        fn, label = kernel.fn, kernel.describe()
    results = [check_case(fn, case, label, ctx.device) for case in _cases(op, dtype, ctx.spec.seed, True)]
    bad = [r for r in results if not r.ok]
    if bad:
        raise CheckFailed(f"{len(bad)} of {len(results)} cases outside tolerance (expected |out - golden| <= "
                          f"atol + rtol |golden| against the float64 golden): "
                          + "; ".join(r.describe() for r in bad))
    worst = max(results, key=lambda r: r.worst_ratio)
    return Passed(f"{len(results)} cases via {label}; worst err/allowed {worst.worst_ratio:.3g} "
                  f"(case {worst.case}, rtol {worst.rtol:.3g}, atol {worst.atol:.3g})")


def _flat(value: Any, name: str):
    """(name, tensor) for every tensor in an argument (lists and dicts included)."""
    import torch
    if isinstance(value, torch.Tensor):
        yield name, value
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _flat(v, f"{name}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _flat(v, f"{name}.{k}")


def _same_bytes(a, b) -> bool:
    import torch
    a, b = a.detach().to("cpu").contiguous(), b.detach().to("cpu").contiguous()
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == torch.bool or not a.numel():
        return torch.equal(a, b)
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _dense(t) -> bool:
    """Non-overlapping and dense: every element has its own storage slot, with no gaps (strides are
    a permutation of a contiguous layout's), as every torch kernel's fresh output is."""
    if t.numel() == 0:
        return True
    expected = 1
    for stride, n in sorted((st, n) for n, st in zip(t.shape, t.stride()) if n != 1):
        if stride != expected:
            return False
        expected *= n
    return True


def contract_problem(case, args: tuple, kwargs: dict, before: list, outs: list, device) -> Optional[str]:
    """What breaks the op contract beyond the values: an input changed (other than the ones the op
    updates in place, adamw_step's params and moments), or an output on another device, not dense,
    not contiguous although every input is (torch's own kernels give contiguous outputs then, and
    model code calls .view() on them), or sharing storage with an input."""
    import torch
    for name, t, copy in before:
        if not _same_bytes(t, copy):
            n = int((t.detach().to("cpu") != copy).sum()) if t.dtype != torch.bool else -1
            return f"input {name} was changed by the op ({n} elements differ): ops must not touch their inputs"
    if case.mutates:
        return None
    ins = [t for _, t, _ in before]
    for i, out in enumerate(o for o in outs if isinstance(o, torch.Tensor)):
        where = f"output {i}" if len(outs) > 1 else "output"
        if out.device.type != torch.device(device).type:
            return f"{where} on {out.device}, expected the chip's device {device}"
        if not _dense(out):
            return f"{where} has overlapping or gapped strides {tuple(out.stride())} for shape {tuple(out.shape)}"
        if all(t.is_contiguous() for t in ins) and not out.is_contiguous():
            return (f"{where} is not contiguous (strides {tuple(out.stride())} for shape {tuple(out.shape)}) although "
                    f"every input is; torch's own op gives a contiguous tensor")
        for name, t, _ in before:
            if out.numel() and t.numel() and out.untyped_storage().data_ptr() == t.untyped_storage().data_ptr():
                return f"{where} shares storage with input {name}: a later in-place update of one changes the other"
    if case.op == "embedding":  # a gather is a copy: bit for bit, NaN payloads and infinities included
        ids, weight = args[0], args[1]
        want = weight.detach().to("cpu")[ids.detach().to("cpu")]
        if outs and isinstance(outs[0], torch.Tensor) and not _same_bytes(outs[0], want):
            return "output rows are not bit-exact copies of the weight rows (a gather must copy, not compute)"
    return None


def check_case(fn: Callable, case, label: str, device):
    """`hal.ops.golden.check` plus the op contract (`contract_problem`) on the same call."""
    import torch
    from hal.ops import golden
    from hal.ops.tolerances import tolerance
    rtol, atol = tolerance(case.op, case.dtype)
    res = golden.CheckResult(case.op, case.name, str(case.dtype).removeprefix("torch."), label, rtol, atol)
    args, kwargs = case.build(torch.device(device))
    before = [(name, t, t.detach().to("cpu").clone())
              for i, a in enumerate(args) if i not in case.mutates for name, t in _flat(a, f"{i}")]
    before += [(name, t, t.detach().to("cpu").clone()) for name, t in _flat(kwargs, "kwargs")]
    try:
        outs = golden._outputs(fn(*args, **kwargs), args, case.mutates)
    except Exception as exc:  # a kernel that raises fails the check; the message says how
        res.problem = f"raised {type(exc).__name__}: {exc}"
        return res
    res.max_abs_err, res.worst_ratio, res.problem = golden.compare(outs, golden.golden(case), case.dtype, rtol, atol)
    res.problem = res.problem or contract_problem(case, args, kwargs, before, outs, device)
    return res


def discover(target: Target) -> list[Check]:
    from hal.contract.kernel import OP_NAMES
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
        checks.append(Check(f"ops.refusals.{op}", "ops",
                            f"{op} on inputs the HAL reference refuses (raises) or answers with NaN/inf: the kernel "
                            f"raises where it raises, matches where it returns (ops_refusals.py)",
                            check_refusals, (op,)))
    return checks + _addon_checks(target)


def _addon_checks(target: Target) -> list[Check]:
    """For an add-on under test: every case and refusal rule again on each kernel the add-on ships,
    run directly (`ops.<op>.*` above check what the chip dispatches with the add-on installed)."""
    checks = []
    for op, kernels in target.addon_kernels().items():
        for d in DTYPES:
            checks.append(Check(f"ops.addon.{op}.{d}", "ops",
                                f"the add-on's own {op} kernel ({kernels[0]}) in {d} vs the float64 golden",
                                check_op, (op, d, False, True)))
        checks.append(Check(f"ops.addon.refusals.{op}", "ops",
                            f"the add-on's own {op} kernel on the refusal table (ops_refusals.py)",
                            check_refusals, (op, True)))
    return checks
