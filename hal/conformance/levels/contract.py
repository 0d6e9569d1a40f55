"""Level `contract`: the plugin against `hal.contract.hookspecs`, checked in this process (no device needed).

Registration (`PluginManager.register`) already refuses a plugin that breaks the contract; these
checks report each part separately, and add what registration cannot know: figures that validate
but are implausible (a TFLOP/s number written as FLOP/s), capability entries that name no
collective/dtype/op or combinations without a meaning (bitwise ops on floats), op kernels whose
signature does not accept the op's arguments, a native probe that raises or returns a non-bool.
"""
from __future__ import annotations

import inspect
import re

from ..checks import Check, CheckFailed, CheckNotApplicable, CheckSkipped
from ..target import LocalContext

# Physical ranges per profile field (per device, per direction for links), the value a figure must lie
# in. Each bound is the most extreme part that ships (or the slowest thing still worth a plan) times a
# margin of 2..10; a figure outside is in another unit (TFLOP/s for FLOP/s, bits for bytes, GiB for
# bytes), not an unusual chip. A planner prices the network from these figures, so a bits-for-bytes
# NIC (8x) or a TFLOP/s peak (1e12x) would misprice every plan.
#   field                 (min, max, why)
PLAUSIBLE: dict[str, tuple[float, float, str]] = {
    # Lowest: 1e9 FLOP/s, one scalar core of a 2000s CPU (a TFLOP/s figure written as FLOP/s is ~1e3).
    # Highest: 1e17 FLOP/s, 7x the densest shipping part (B300 ~15e15 dense FP4; H100 bf16 dense 9.9e14).
    "peak_flops": (1e9, 1e17, "1 GFLOP/s (one old CPU core) .. 1e17 (7x B300's dense FP4 peak)"),
    # Lowest: 1 GiB, below which no training shard fits (the smallest catalogued part has 16 GB).
    # Highest: 64 TiB, 2x the largest shipping host (8-socket servers with 32 TiB; the cpu chip's
    # profile is the host's RAM); accelerators are at most 288 GB (B300, MI355X).
    "memory_bytes": (2 ** 30, 2 ** 46, "1 GiB (nothing smaller holds a shard) .. 64 TiB (2x the largest "
                                       "8-socket host's 32 TiB)"),
    # Lowest: 1e9 B/s, a tenth of one DDR3 channel. Highest: 5e13 B/s, 6x B300's 8 TB/s HBM3e.
    "memory_bandwidth": (1e9, 5e13, "1 GB/s (a tenth of one DDR3 channel) .. 50 TB/s (6x B300's 8 TB/s HBM3e)"),
    # Per direction per device. Lowest: 1e8 B/s, below PCIe gen1 x1 (2.5e8). Highest: 2e12 B/s, 2x
    # NVLink 5's 900 GB/s per direction (GB200/B300), so NVLink 4's 450e9 in bits (3.6e12) is out.
    "intra_node_bandwidth": (1e8, 2e12, "100 MB/s (below PCIe gen1 x1) .. 2 TB/s (2x NVLink 5's 900 GB/s per "
                                        "direction)"),
    # Per direction per device. Lowest: 1e8 B/s, below 1 GbE (1.25e8). Highest: 2e11 B/s, 2x the fastest
    # per-GPU network that ships (one 800 Gb/s ConnectX-8 = 1e11 B/s), so a 400 Gb/s NIC in bits
    # (4e11) is out.
    "nic_bandwidth": (1e8, 2e11, "100 MB/s (below 1 GbE) .. 200 GB/s (2x one 800 Gb/s NIC per device)"),
}
_UNIT_HINT = {"FLOP/s": "TFLOP/s or GFLOP/s written as FLOP/s?", "B": "GB/GiB written as bytes, or bytes as GiB?",
              "B/s": "bits/s written as B/s (8x), or GB/s as B/s?"}


def implausible(prof) -> list[str]:
    """What is outside `PLAUSIBLE` in a profile: field, value, unit, the range and its reason."""
    problems = []
    for name, fig in _figures(prof):
        if not fig.known:
            continue
        lo, hi, why = PLAUSIBLE[name.split("[")[0]]
        if not lo <= fig.value <= hi:
            problems.append(f"{name} = {fig.value:g} {fig.unit} is outside the physical range [{lo:g}, {hi:g}] "
                            f"{fig.unit} ({why}): {_UNIT_HINT[fig.unit]}")
    return problems


def _need(ctx: LocalContext):
    t = ctx.target
    if t.record is None:
        raise CheckSkipped("the plugin did not register (see contract.registers)")
    return t


def check_registers(ctx: LocalContext) -> str:
    t = ctx.target
    if t.record is None:
        raise CheckFailed(f"expected plugin {t.plugin!r} to load and validate against the contract; {t.load_error}")
    rec = t.record
    return (f"plugin {rec.name!r} {rec.info.version} registered from {rec.distribution or t.plugin}, "
            f"chips {rec.chips}")


def check_metadata(ctx: LocalContext) -> str:
    info = _need(ctx).record.info
    problems = []
    if not re.match(r"^\d+(\.\d+)*([abc]|rc|\.dev|\.post)?\d*([+.-][A-Za-z0-9.]+)?$", info.version):
        problems.append(f"version {info.version!r} is not a PEP 440 version such as '1.2.0'")
    if problems:
        raise CheckFailed("; ".join(problems))
    note = "" if info.description.strip() else " (no description: `hal info` would show one)"
    return f"name {info.name!r}, version {info.version}{note}"


def check_version(ctx: LocalContext) -> str:
    from hal.contract.version import CONTRACT_VERSION, compatible
    info = _need(ctx).record.info
    if not compatible(info.contract_version):
        raise CheckFailed(f"contract_version {info.contract_version}, expected {CONTRACT_VERSION.split('.')[0]}.x "
                          f"with x <= {CONTRACT_VERSION.split('.')[1]} (this HAL implements {CONTRACT_VERSION})")
    return f"implements contract {info.contract_version}; this HAL implements {CONTRACT_VERSION}"


def check_hooks(ctx: LocalContext) -> str:
    from hal.contract import hookspecs
    from hal.core.plugin_manager import REQUIRED_HOOKS, REQUIRED_PER_CHIP
    t = _need(ctx)
    module, pm = t.record.module, t.pm.pm
    implemented, problems = [], []
    for name in dir(module):
        if pm.parse_hookimpl_opts(module, name) is None:
            continue
        implemented.append(name)
        spec = getattr(hookspecs, name, None)
        if spec is None:
            problems.append(f"{name} is not a hook of the contract")
            continue
        want = list(inspect.signature(spec).parameters)
        got = list(inspect.signature(getattr(module, name)).parameters)
        extra = [a for a in got if a not in want]
        if extra:
            problems.append(f"{name}{inspect.signature(getattr(module, name))}: arguments {extra} are not in "
                            f"the spec {name}{inspect.signature(spec)}")
    required = list(REQUIRED_HOOKS) + (list(REQUIRED_PER_CHIP) if t.record.chips else [])
    missing = [h for h in required if h not in implemented]
    if missing:
        problems.append(f"required hooks not implemented: {missing}")
    if problems:
        raise CheckFailed("; ".join(problems))
    return f"implements {sorted(implemented)}"


def check_chip_spec(ctx: LocalContext) -> str:
    t = _need(ctx)
    spec = t.pm.chip(t.chip)
    problems = []
    if not spec.torch_device_type.strip():
        problems.append("torch_device_type is empty")
    if not spec.ccl_backend.strip():
        problems.append("ccl_backend is empty")
    if spec.visible_devices_env is not None and not re.match(r"^[A-Z][A-Z0-9_]*$", spec.visible_devices_env):
        problems.append(f"visible_devices_env {spec.visible_devices_env!r} is not an environment variable name")
    if problems:
        raise CheckFailed(f"chip {t.chip!r}: " + "; ".join(problems))
    return (f"chip {spec.name!r} by {spec.vendor}: torch device {spec.torch_device_type!r}, CCL backend "
            f"{spec.ccl_backend!r} ({spec.ccl_name or 'no CCL name'})")


def check_profile(ctx: LocalContext) -> str:
    t = _need(ctx)
    try:
        prof = t.pm.profile(t.chip, None)
    except Exception as exc:
        raise CheckFailed(f"the default profile of chip {t.chip!r} does not validate: {exc}") from exc
    known = [k for k, f in prof.peak_flops.items() if f.known]
    return (f"profile {prof.model!r} validates; peak FLOP/s known for {known or 'no dtype'}; every known figure "
            f"has a source")


def _figures(prof):
    yield from ((f"peak_flops[{k}]", f) for k, f in prof.peak_flops.items())
    for name in ("memory_bytes", "memory_bandwidth", "intra_node_bandwidth", "nic_bandwidth"):
        yield name, getattr(prof, name)


def check_profile_plausible(ctx: LocalContext) -> str:
    t = _need(ctx)
    prof = t.pm.profile(t.chip, None)
    problems = implausible(prof)
    if problems:
        raise CheckFailed(f"profile {prof.model!r}: " + "; ".join(problems))
    n = sum(1 for _, f in _figures(prof) if f.known)
    return f"{n} known figures within their fields' physical ranges (contract.PLAUSIBLE)"


def check_native_probe(ctx: LocalContext) -> str:
    t = _need(ctx)
    try:
        value = t.pm.call_owner(t.chip, "hal_native_available")
    except Exception as exc:
        raise CheckFailed(f"hal_native_available({t.chip!r}) raised {type(exc).__name__}: {exc}; it must return "
                          f"False when the adapter is missing, never raise") from exc
    if not isinstance(value, bool):
        raise CheckFailed(f"hal_native_available({t.chip!r}) returned {value!r}, expected True or False")
    return f"hal_native_available({t.chip!r}) -> {value}" + (" (run emulated)" if t.emulated else "")


def check_capabilities(ctx: LocalContext) -> str:
    from hal.contract.capabilities import COLLECTIVES, DTYPES, REDUCE_OPS, REDUCING, CapabilityMatrix
    from .collective_golden import FLOAT_DTYPES
    t = _need(ctx)
    caps = t.pm.capabilities(t.chip)
    if not isinstance(caps, CapabilityMatrix):
        raise CheckFailed(f"hal_collective_capabilities returned {caps!r}, expected hal.CapabilityMatrix")
    problems = []
    if caps.chip != t.chip:
        problems.append(f"matrix is for chip {caps.chip!r}, expected {t.chip!r}")
    if not caps.source.strip():
        problems.append("source is empty: say how the matrix was obtained (measured, vendor docs, source)")
    for c, d, o in sorted(caps.entries):
        if c not in COLLECTIVES or d not in DTYPES or (o != "-" and o not in REDUCE_OPS):
            problems.append(f"entry {(c, d, o)} names no known collective/dtype/op")
        elif (c in REDUCING) != (o != "-"):
            problems.append(f"entry {(c, d, o)}: reducing collectives take a reduce op, others '-'")
        elif o in ("band", "bor", "bxor") and d in FLOAT_DTYPES:
            problems.append(f"entry {(c, d, o)}: a bitwise op on a floating dtype has no meaning")
        if len(problems) > 8:
            break
    if problems:
        raise CheckFailed("; ".join(problems))
    return f"{len(caps.entries)} entries, source: {caps.source}"


def check_op_kernels(ctx: LocalContext) -> str:
    from hal.contract.kernel import OP_SIGNATURES
    t = _need(ctx)
    problems, seen = [], []
    modes = [True] + ([False] if t.native_available else [])
    for emulated in modes:
        for k in t.pm.op_kernels(t.chip, emulated):
            if k.plugin != t.plugin_name:
                continue
            seen.append(f"{k.op}{' (emulated)' if emulated else ''}")
            params = OP_SIGNATURES[k.op].strip("()").split(", ")
            names = [p.split("=")[0] for p in params]
            try:
                sig = inspect.signature(k.fn)
            except (TypeError, ValueError):
                continue
            try:  # every argument of the op, by name, as hal.ops passes them
                sig.bind(*names)
            except TypeError as exc:
                problems.append(f"{k.op}: kernel {k.describe()} has signature {sig}, which cannot take the "
                                f"op's arguments {OP_SIGNATURES[k.op]}: {exc}")
    if problems:
        raise CheckFailed("; ".join(dict.fromkeys(problems)))  # native and emulated lists may repeat
    if not seen:
        return "no op overrides (every op runs the HAL reference)"
    return f"{len(seen)} kernels with the ops' signatures: {', '.join(seen)}"


def check_device_runtime(ctx: LocalContext) -> str:
    from hal.contract.runtime import DeviceRuntime
    t = _need(ctx)
    if t.emulated or not t.native_available:
        raise CheckNotApplicable(f"chip {t.chip!r} runs emulated in this run; the runtime level checks the emulated "
                                 f"runtime")
    rt = t.pm.call_owner(t.chip, "hal_device_runtime")
    if not isinstance(rt, DeviceRuntime):
        raise CheckFailed(f"hal_device_runtime returned {rt!r}, expected a hal.DeviceRuntime")
    spec = t.pm.chip(t.chip)
    problems = []
    if rt.device_type != spec.torch_device_type:
        problems.append(f"runtime.device_type {rt.device_type!r}, expected the chip's torch_device_type "
                        f"{spec.torch_device_type!r}")
    if rt.Stream is None or rt.Event is None:
        problems.append("runtime.Stream / runtime.Event are not set")
    if problems:
        raise CheckFailed("; ".join(problems))
    return f"{type(rt).__name__} on device type {rt.device_type!r}"


_CHECKS = [
    ("registers", "the plugin loads (entry point or module) and registers against the contract", check_registers),
    ("metadata", "PluginInfo: a name and a PEP 440 version", check_metadata),
    ("version", "contract_version is compatible with this HAL's CONTRACT_VERSION", check_version),
    ("hooks", "required hooks implemented, every hook is in the contract with the spec's arguments", check_hooks),
    ("chip_spec", "ChipSpec: torch device type, CCL backend, visible-devices variable name", check_chip_spec),
    ("profile", "the default ChipProfile validates (units, sources)", check_profile),
    ("profile_plausible", "every known profile figure is in its field's physical range (memory, FLOP/s, bandwidths)",
     check_profile_plausible),
    ("native_probe", "hal_native_available returns a bool and never raises", check_native_probe),
    ("capabilities", "the capability matrix is for this chip, has a source, names real combinations",
     check_capabilities),
    ("op_kernels", "every op kernel the plugin offers accepts the op's arguments", check_op_kernels),
    ("device_runtime", "native only: hal_device_runtime gives a DeviceRuntime of the chip's device type",
     check_device_runtime),
]


def discover(target) -> list[Check]:
    checks = [Check(f"contract.{name}", "contract", doc, fn, where="local") for name, doc, fn in _CHECKS]
    if getattr(target, "is_addon", False):
        from .addon import check_addon_effect
        checks.append(Check("contract.addon_effect", "contract", "an add-on: what it changes on the chip (kernels "
                            "dispatched, wrapped hook answers) against the chip's owner alone", check_addon_effect,
                            where="local"))
    return checks
