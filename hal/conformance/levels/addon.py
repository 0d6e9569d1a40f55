"""`contract.addon_effect`: what an add-on (a plugin that declares no chip: faster kernels, wrappers,
tryfirst overrides) changes on the chip it is certified for, found by asking the same hooks with and
without it.

The chip's owner is loaded alone into a second manager; the answers of the chip-scoped hooks that can
be asked without a device (native_available, chip_profile, collective_capabilities) and the chip's
kernel table are compared with the answers of owner + add-on (the target's manager, which is what a
real install dispatches through pluggy, wrappers included). The check fails when an add-on kernel is
never dispatched on the chip (a higher-priority kernel shadows it) or when the add-on changes nothing
there at all. Wrappers of hal_device_runtime and hal_create_process_group act only when the chip is
bound natively: they are listed, and the runtime and collectives levels exercise them on a native
chip; here they cannot be observed (said in the result).
"""
from __future__ import annotations

from typing import Any

from ..checks import CheckFailed
from ..target import LocalContext, load_plugin

LOCAL_HOOKS = {"hal_native_available": "native_available", "hal_chip_profile": "profile",
               "hal_collective_capabilities": "capabilities"}
NATIVE_ONLY = ("hal_device_runtime", "hal_create_process_group")


def _hooks(pm, module) -> dict[str, str]:
    """hook -> how the add-on implements it (plain, tryfirst, wrapper)."""
    out = {}
    for name in dir(module):
        opts = pm.parse_hookimpl_opts(module, name)
        if opts is None:
            continue
        kind = "wrapper" if opts.get("wrapper") or opts.get("hookwrapper") else (
            "tryfirst" if opts.get("tryfirst") else "plain")
        out[name] = kind
    return out


def _winners(kernels) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in kernels:  # highest priority first
        out.setdefault(k.op, k)
    return out


def _kernel_effects(t, alone) -> tuple[list[str], list[str]]:
    """(effects, problems) of the add-on on the chip's kernel table."""
    effects, problems = [], []
    combined = t.pm.op_kernels(t.chip, t.emulated)
    winners = _winners(combined)
    for k in (k for k in combined if k.plugin == t.plugin_name):
        win = winners[k.op]
        if win is k:
            effects.append(f"{k.op} dispatches to the add-on's {k.describe()}")
        else:
            problems.append(f"{k.op}: the add-on's {k.describe()} is never dispatched on chip {t.chip!r}: "
                            f"{win.describe()} has priority {win.priority} (raise the add-on's priority above it)")
    before = [(k.op, k.fn, k.priority) for k in alone.op_kernels(t.chip, t.emulated)]
    after = [(k.op, k.fn, k.priority) for k in combined if k.plugin != t.plugin_name]
    if before != after:  # a wrapper of hal_op_kernels rewrote the owner's list
        changed = sorted({op for op, *_ in set(before) ^ set(after)})
        effects.append(f"a wrapper of hal_op_kernels changes the owner's kernels for {changed}")
    return effects, problems


def addon_kernel(ctx, op: str):
    """The add-on under test's own best kernel for `op` on the bound chip, whether or not it is the
    one the chip dispatches (an add-on is certified on every kernel it ships)."""
    from hal.core.plugin_manager import get_plugin_manager
    mine = [k for k in get_plugin_manager().op_kernels(ctx.acc.chip.name, ctx.acc.emulated)
            if k.op == op and k.plugin == ctx.spec.addon]
    if not mine:
        raise CheckFailed(f"add-on {ctx.spec.addon!r} offered a kernel for {op} when the suite was planned, "
                          f"but none when bound on rank {ctx.rank}")
    return mine[0]


def check_addon_effect(ctx: LocalContext) -> str:
    t = ctx.target
    if t.record is None or t.pm is None:
        raise CheckFailed(f"the add-on did not load on top of {t.owner!r}: {t.load_error}")
    alone, owner_record, error = load_plugin(str(t.owner))
    if owner_record is None:
        raise CheckFailed(f"the chip's owner {t.owner!r} does not load alone: {error}")
    hooks = _hooks(t.pm.pm, t.record.module)
    effects, problems = _kernel_effects(t, alone)
    for hook, method in LOCAL_HOOKS.items():
        if hook not in hooks:
            continue
        try:
            mine, theirs = getattr(t.pm, method)(t.chip), getattr(alone, method)(t.chip)
        except Exception as exc:  # the combined answer must still validate as the owner's does
            problems.append(f"{hook} ({hooks[hook]}) for chip {t.chip!r} with the add-on raised "
                            f"{type(exc).__name__}: {exc}")
            continue
        effects.append(f"{hook} ({hooks[hook]}) " + ("changes the chip's answer" if mine != theirs
                                                     else "leaves the chip's answer unchanged"))
    native_only = [f"{h} ({hooks[h]})" for h in NATIVE_ONLY if h in hooks]
    if problems:
        raise CheckFailed("; ".join(problems))
    visible = [e for e in effects if not e.endswith("unchanged")]
    if not visible and not native_only:
        raise CheckFailed(f"add-on {t.plugin_name!r} changes nothing on chip {t.chip!r} (owner {t.owner}): no kernel "
                          f"of it is dispatched and no hook answer differs (hooks it implements: {sorted(hooks)})")
    tail = (f"; {', '.join(native_only)} act only on a native chip (the runtime and collectives levels "
            f"exercise them there; not observable here)" if native_only else "")
    return f"on chip {t.chip!r} over {t.owner}: " + "; ".join(effects or ["no local effect"]) + tail
