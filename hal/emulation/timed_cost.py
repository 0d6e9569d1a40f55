"""What an op costs on a timed-emulated chip (hal.emulation.timed): the chip's speeds, the one formula, and
an op's FLOPs, bytes and dtype.

    cost(op) = max(flops(op) / F(dtype(op)), bytes(op) / B)     F, B = chip_speeds(chip, dtype, scale)

F is charged at the dtype the op computes in (its first floating-point operand's: a bfloat16 matmul at the
chip's bfloat16 rate, a float32 one at its float32 rate): `Speeds.rates` holds every dtype the chip has a
figure for, `Speeds.flops_for(dtype, op)` picks one, and a dtype the chip has none for is a
TimedEmulationError naming chip, op and dtype (no fallback). An explicit override re-maps dtypes
(`charge_plan`, HAL_EMULATE_TIMED_DTYPE). A planner predicting an emulated run prices work with
`chip_speeds` and `op_cost` (or a recorded op trace with `hal.emulation.timed.record_ops` +
`trace_cost`); hal.emulation.timed's clock charges with the same. The approximations (FLOPs of
matmul-like ops only, bytes = inputs + outputs) are stated in hal.emulation.timed.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Union

import torch

from hal.contract.chips import DTYPE_KEYS, ChipProfile
from hal.contract.errors import HalError

# Achieved FLOP/s are no single constant: the chip's efficiency matrix (hal.core.chip_matrix; defaults in
# the catalog, each sourced) gives each GEMM its fraction of peak by shape, fused attention its own, and
# memory-bound ops a fraction of the memory bandwidth. A clock's F for a dtype is the chip's best sustained
# rate in it (peak(dtype) x best_fraction: the matrix's fractions are of the peak of the dtype the work
# runs in); an op the matrix rates lower is charged its FLOPs x best / its fraction.
# Figures the catalog lists as unknown: chip model -> figure -> (value, why). The one definition
# (hal/strategies/planner/facts.py imports it).
ASSUMED: dict[str, dict[str, tuple[float, str]]] = {
    "P800": {
        "peak_bf16": (345e12, "assumed: the '345 TFLOPS FP16' figure of industry analyses "
                              "(the catalog notes it has no vendor datasheet)"),
        "memory_bw": (2.0e12, "assumed: HBM-class module, about 910B2's"),
    },
    "910B2": {
        "memory_bw": (1.6e12, "assumed: HBM2e, 1.6 TB/s class (no figure in the catalog)"),
    },
}
DEFAULT_MEMORY_BW = (1.5e12, "default: 1.5 TB/s")
# The reference dtype: what `Speeds.flops_per_s` and the MFU peak are given in when nobody names one (the
# dtype a real run trains in); a chip without it takes the first of REFERENCE_DTYPES it has a rate for.
DEFAULT_DTYPE = "bfloat16"
REFERENCE_DTYPES = ("bfloat16", "float16", "float32", "tf32", "float64", "float8", "int8")
# torch dtype -> the catalog's dtype key (an op in any other dtype has no rate on any chip)
DTYPE_KEY: dict[torch.dtype, str] = {
    torch.float64: "float64", torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
    torch.int8: "int8", **{getattr(torch, n): "float8" for n in ("float8_e4m3fn", "float8_e5m2",
                                                                 "float8_e4m3fnuz", "float8_e5m2fnuz")
                           if hasattr(torch, n)}}


class TimedEmulationError(HalError, ValueError):
    """Timed emulation was asked for in a way it cannot run: names the variable/argument and value."""


class Speeds(tuple):
    """What the virtual clock charges at: (flops_per_s, bytes_per_s, source), FLOP/s the chip's best
    sustained rate in the reference dtype (`dtype`) and bytes/s, both already divided by the scale; and,
    as attributes, the efficiency matrix that rates each op against the best (`matrix`, None: every op at
    the best rate), the reference dtype's peak / scale (`peak_flops_per_s`, the MFU denominator), the best
    sustained FLOP/s / scale of every dtype the chip has a figure for (`rates`), the explicit re-mapping
    of op dtypes (`charge_as`: {op dtype or '*': dtype charged}) and the chip's name (`chip`). A Speeds
    built with no `rates` (a test's, a planner's one-rate figure) charges every dtype at flops_per_s.
    Unpacks as the three figures."""

    matrix: Any
    peak_flops_per_s: float
    rates: Mapping[str, float]
    charge_as: Mapping[str, str]
    chip: str
    dtype: str

    def __new__(cls, flops_per_s: float, bytes_per_s: float, source: str, matrix: Any = None,
                peak_flops_per_s: float = 0.0, *, rates: Optional[Mapping[str, float]] = None,
                charge_as: Optional[Mapping[str, str]] = None, chip: str = "", dtype: str = DEFAULT_DTYPE) -> "Speeds":
        self = super().__new__(cls, (flops_per_s, bytes_per_s, source))
        self.matrix = matrix
        self.peak_flops_per_s = peak_flops_per_s
        self.rates, self.charge_as = dict(rates or {}), dict(charge_as or {})
        self.chip, self.dtype = chip, dtype
        return self

    @property
    def flops_per_s(self) -> float:
        return self[0]

    @property
    def bytes_per_s(self) -> float:
        return self[1]

    @property
    def source(self) -> str:
        return self[2]

    def flops_for(self, dtype: Optional[str], op: str = "op") -> float:
        """Best sustained FLOP/s / scale at which an op computing in `dtype` (a DTYPE_KEYS key; None: the
        reference dtype) is charged; TimedEmulationError naming chip, op and dtype if the chip has none."""
        if dtype is None or not self.rates:
            return self.flops_per_s
        charged = self.charge_as.get(dtype) or self.charge_as.get("*") or dtype
        rate = self.rates.get(charged)
        if not rate:
            how = f" (charged as {charged} by HAL_EMULATE_TIMED_DTYPE)" if charged != dtype else ""
            raise TimedEmulationError(
                f"timed emulation of chip {self.chip!r}: op {op!r} computes in {dtype}{how}, and the chip has no "
                f"{charged} FLOP/s figure (catalog: unknown or absent; it has {sorted(self.rates)}). Train in a "
                f"dtype it has ([train] precision = 'auto'), or charge {dtype} at another dtype's rate explicitly: "
                f"HAL_EMULATE_TIMED_DTYPE='{self.chip.split(' ')[0]}:{dtype}=<dtype>' ([cluster] timed_dtype)")
        return rate


# ---- the one formula for an emulated chip's speeds -------------------------------------------------
def _profile_of(chip: Union[str, ChipProfile], model: Optional[str]) -> Optional[ChipProfile]:
    if isinstance(chip, ChipProfile):
        return chip
    from hal.core import catalog
    try:
        return catalog.get(chip, model) if model else catalog.default(chip)
    except HalError:  # a chip the catalog lacks (cpu, a vendor's own): no profile
        return None


def _assumed(prof: Optional[ChipProfile], model: Optional[str]) -> dict[str, tuple[float, str]]:
    for key, table in ASSUMED.items():
        if (model and key.lower() == str(model).lower()) or (prof is not None and key in prof.model):
            return table
    return {}


def chip_speeds(chip: Union[str, ChipProfile], dtype: Optional[str] = DEFAULT_DTYPE, scale: float = 1.0, *,
                model: Optional[str] = None, matrix: Any = None,
                charge_as: Optional[Mapping[str, str]] = None) -> Speeds:
    """(flops_per_s, bytes_per_s, source) that timed emulation charges `chip` at: the one definition
    a planner predicting an emulated run must use. flops_per_s is in `dtype` (None: the first of
    REFERENCE_DTYPES the chip has a rate for); `.rates` holds every dtype's, the clock charges each op at
    its own. `chip`: a chip name (its catalog default model, or `model`) or a ChipProfile; `matrix`: an
    `hal.core.efficiency.EfficiencyMatrix` whose measured figures replace the catalog's; `scale`: the
    time scale (1 = the real chip's speed); `charge_as`: explicit re-mapping of op dtypes (`charge_plan`)."""
    if dtype is not None and dtype not in DTYPE_KEYS:
        raise TimedEmulationError(f"timed emulation dtype {dtype!r} is not one of {DTYPE_KEYS}")
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise TimedEmulationError(f"timed emulation scale {scale!r} must be a finite number > 0")
    prof = _profile_of(chip, model)
    name = prof.model if prof is not None else str(model or chip)
    label = f"{chip.chip if isinstance(chip, ChipProfile) else chip} ({name})"
    cm = _chip_matrix(chip, prof, model)
    rates = _rates(prof, _assumed(prof, model), cm, matrix, name)
    if dtype is None:
        dtype = next((d for d in REFERENCE_DTYPES if d in rates), DEFAULT_DTYPE)
    if dtype not in rates:
        known = sorted(k for k, f in (prof.peak_flops.items() if prof else []) if f.value)
        raise TimedEmulationError(
            f"timed emulation of chip {name!r}: no {dtype} peak FLOP/s (catalog: unknown) or no efficiency matrix "
            f"and no measured one; charge another dtype (HAL_EMULATE_TIMED_DTYPE, known: {known}) or give "
            f"HAL_EMULATE_TIMED_MATRIX")
    bad = {k: v for k, v in (charge_as or {}).items() if v not in rates}
    if bad:
        raise TimedEmulationError(f"HAL_EMULATE_TIMED_DTYPE charges {bad} on chip {label}, which has no FLOP/s "
                                  f"figure for {sorted(set(bad.values()))} (it has {sorted(rates)})")
    flops, peak, fsrc = rates[dtype]
    if matrix is not None and matrix.best_matmul_flops(dtype) and cm is not None:
        mbw = prof.memory_bandwidth.value if prof is not None else None
        cm = cm.with_measured(matrix, peak, mbw, f"{matrix.chip} {matrix.profile_model}")
    nbytes, bsrc = _bandwidth(prof, _assumed(prof, model), cm, matrix, name)
    source = f"{fsrc}; {bsrc} {nbytes / 1e12:.4g} TB/s; / time scale {scale:g}"
    if charge_as:
        source += "; op dtypes charged as " + ", ".join(f"{k}->{v}" for k, v in sorted(charge_as.items()))
    return Speeds(flops / scale, nbytes / scale, source, cm, peak / scale,
                  rates={d: r[0] / scale for d, r in rates.items()}, charge_as=charge_as, chip=label, dtype=dtype)


def _rates(prof: Optional[ChipProfile], assumed: dict, cm: Any, matrix: Any, name: str) -> dict[str, tuple]:
    """dtype -> (best sustained FLOP/s, peak FLOP/s, source) for every dtype the chip has a figure for: a
    measured matmul (`matrix`), else the catalog (or ASSUMED) peak x the efficiency matrix's best fraction."""
    out: dict[str, tuple] = {}
    for d in DTYPE_KEYS:
        peak = prof.peak(d) if prof is not None else None
        psrc = f"catalog {name} {d} peak"
        if not peak and d == "bfloat16" and "peak_bf16" in assumed:
            peak, psrc = assumed["peak_bf16"]
        best = matrix.best_matmul_flops(d) if matrix is not None else None
        if best:
            out[d] = (best, peak or best, f"measured {d} matmul ({matrix.chip} {matrix.profile_model}"
                      + (", EMULATED host" if matrix.emulated else "") + ")")
        elif peak and cm is not None:
            out[d] = (cm.best_fraction * peak, peak, f"best GEMM fraction {cm.best_fraction:.3g} (efficiency "
                      f"matrix {cm.origin}) x {psrc} {peak / 1e12:.4g} TFLOP/s")
    return out


def _bandwidth(prof: Optional[ChipProfile], assumed: dict, cm: Any, matrix: Any, name: str) -> tuple[float, str]:
    """(memory bytes/s, source): measured device copy, else catalog / ASSUMED / default x the matrix's fraction."""
    if matrix is not None and matrix.memory_bytes_per_s():
        return matrix.memory_bytes_per_s(), f"measured device copy ({matrix.chip} {matrix.profile_model})"
    if prof is not None and prof.memory_bandwidth.value:
        nbytes, bsrc = prof.memory_bandwidth.value, f"catalog {name} memory bandwidth"
    elif "memory_bw" in assumed:
        nbytes, bsrc = assumed["memory_bw"]
    else:
        nbytes, bsrc = DEFAULT_MEMORY_BW
    if cm is not None:
        nbytes, bsrc = nbytes * cm.memory, f"{cm.memory:.3g} x {bsrc}"
    return nbytes, bsrc


def charge_plan(text: str, chip: str, model: str) -> tuple[Optional[str], dict[str, str]]:
    """Parse HAL_EMULATE_TIMED_DTYPE for one chip: (the forced dtype or None, {op dtype or '*': dtype
    charged}). Items, comma-separated: `DTYPE` (every op at DTYPE: one-dtype charging) or `FROM=TO` (ops
    computing in FROM at TO's rate), each optionally scoped `CHIP:` (a chip name or model; others ignore
    it). Blank: {} (each op at its own dtype)."""
    forced, mapping = None, {}
    for item in (x.strip() for x in text.split(",") if x.strip()):
        scope, _, rule = item.rpartition(":")
        if scope and scope.lower() not in (chip.lower(), str(model).lower()):
            continue
        src, eq, dst = (p.strip() for p in rule.partition("="))
        for key in ((src, dst) if eq else (src,)):
            if key not in DTYPE_KEYS:
                raise TimedEmulationError(f"HAL_EMULATE_TIMED_DTYPE={text!r}: {key!r} in {item!r} is not one of "
                                          f"{DTYPE_KEYS} (items: DTYPE or FROM=TO, each optionally CHIP:)")
        if eq:
            mapping[src] = dst
        else:
            forced = src
            mapping["*"] = src
    return forced, mapping


def _chip_matrix(chip: Union[str, ChipProfile], prof: Optional[ChipProfile], model: Optional[str]) -> Any:
    """The catalog's efficiency matrix of the chip (None for a chip the catalog lacks: cpu, a vendor's own)."""
    from hal.core import catalog
    name = chip.chip if isinstance(chip, ChipProfile) else chip
    try:
        return catalog.matrix(name, model or (prof.model if prof is not None else None))
    except HalError:
        return None


# ---- what an op costs: its FLOPs rated by the efficiency matrix ------------------------------------
def op_shape(func: Any, args: tuple, kwargs: Optional[dict] = None) -> Optional[tuple]:
    """The matrix class of an op: ("gemm", m, n, k) for a matmul (a batched one folds its batch into m),
    ("attention", share) for scaled-dot-product attention (`attention_share`), None for anything else."""
    name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
    if "scaled_dot_product" in name:
        return ("attention", attention_share(func, args, kwargs or {}))
    if name not in _GEMMS:
        return None
    a, b = (args[1], args[2]) if name in ("addmm", "baddbmm") else (args[0], args[1])
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dim() < 2 or b.dim() < 2:
        return None
    m = a.shape[-2] * (a.shape[0] if a.dim() == 3 else 1)
    return ("gemm", int(m), int(b.shape[-1]), int(a.shape[-1]))


_GEMMS = {"mm", "addmm", "bmm", "baddbmm"}
# the fused SDPA kernels (flash, memory-efficient, cuDNN, a backend's override, torch's CPU flash kernel), which
# skip the score tiles a causal mask hides; any other "scaled_dot_product" op (the math path) computes them all
_FUSED_SDPA = ("flash", "efficient", "cudnn", "overrideable")


def attention_share(func: Any, args: tuple, kwargs: dict) -> float:
    """The share of torch's SDPA FLOP count (sdpa_flop_count: the full s_q x s_k score matrix, whatever
    is_causal says) that a fused kernel does: hal.core.chip_matrix.fused_attention_share of its query and key
    lengths when its `is_causal` argument (read by name from the op's schema; every fused SDPA overload, forward
    and backward, carries it) is true, so a causal core costs about half, as FlashAttention counts it. 1 for
    an unfused op, a non-causal call, or a mask passed as a tensor (attn_mask: its pattern is not read)."""
    from hal.core.chip_matrix import fused_attention_share
    name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
    if not any(k in name for k in _FUSED_SDPA) or not hasattr(func, "_schema"):
        return 1.0
    for i, arg in enumerate(func._schema.arguments):
        if arg.name == "is_causal":
            causal = kwargs[arg.name] if arg.name in kwargs else args[i] if i < len(args) else arg.default_value
            break
    else:
        return 1.0
    back = name.endswith("_backward")        # (grad_out, query, key, ...) instead of (query, key, ...)
    q, k = (args[0], args[2]) if back else (args[0], args[1])
    if not causal or not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)) or q.dim() < 2:
        return 1.0
    return fused_attention_share(int(q.shape[-2]), int(k.shape[-2]), causal=True)


def rate_factor(shape: Optional[tuple], matrix: Any) -> float:
    """How many best-rate FLOPs an op of `shape` costs per FLOP torch counts for it: best fraction / the
    op's fraction in the matrix (>= 1), times, for attention, the share of the count its kernel does
    (`attention_share`: about 1/2 for a fused causal core, whatever the matrix)."""
    if shape is None:
        return 1.0
    share = shape[1] if shape[0] == "attention" and len(shape) > 1 else 1.0
    if matrix is None:
        return share
    frac = matrix.attention_rate if shape[0] == "attention" else matrix.gemm_fraction(*shape[1:])
    return share * matrix.best_fraction / frac if frac > 0 else share


def charged_flops(func: Any, args: tuple, kwargs: dict, out: Any, speeds: Speeds) -> float:
    """FLOPs at the best rate that an op costs on a chip with `speeds`: its FLOPs x `rate_factor`."""
    flops = op_flops(func, args, kwargs, out)
    return flops * rate_factor(op_shape(func, args), speeds.matrix) if flops else 0.0


def op_cost(flops: float, nbytes: float, speeds: Speeds, dtype: Optional[str] = None, op: str = "op") -> float:
    """Seconds one op takes on the emulated chip: the slower of its compute (at the rate of `dtype`, the
    dtype it computes in: `Speeds.flops_for`; None: the reference dtype) and its memory traffic."""
    compute = flops / speeds.flops_for(dtype, op) if flops else 0.0
    return max(compute, nbytes / speeds.bytes_per_s)


def op_dtype(args: tuple) -> Optional[str]:
    """The dtype key an op computes in: its first floating-point (or int8) tensor operand's; None if none."""
    for x in args:
        if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.dtype == torch.int8):
            return DTYPE_KEY.get(x.dtype, str(x.dtype).replace("torch.", ""))
    return None


class TraceOp(tuple):
    """One recorded op: (op name, flops, bytes), unpacking as those three, with its matrix class
    (`op_shape`) as `.shape` and the dtype it computes in as `.dtype`, so a trace is priced for any
    chip's efficiency matrix and rates."""

    shape: Optional[tuple]
    dtype: Optional[str]

    def __new__(cls, op: str, flops: int, nbytes: int, shape: Optional[tuple] = None,
                dtype: Optional[str] = None) -> "TraceOp":
        self = super().__new__(cls, (op, flops, nbytes))
        self.shape, self.dtype = shape, dtype
        return self


def trace_cost(trace: list, speeds: Speeds) -> float:
    """Seconds the ops of a recorded trace (`VirtualClock(record=True).trace`) take at `speeds`: what
    the clock would charge a chip with those speeds for the same ops (a planner's per-layer figure)."""
    mx = getattr(speeds, "matrix", None)
    return sum(op_cost(op[1] * rate_factor(getattr(op, "shape", None), mx), op[2], speeds,
                       getattr(op, "dtype", None), op[0]) for op in trace)


# ---- what an op costs ---------------------------------------------------------------------------
aten = torch.ops.aten
# Ops that launch no kernel on a device (views are excluded by `is_view`).
_FREE = {aten.detach.default, aten.empty.memory_format, aten.empty_strided.default, aten.new_empty.default,
         aten.new_empty_strided.default, aten.empty_like.default, aten.lift_fresh.default,
         aten.is_same_size.default, aten.size.default, aten.sym_size.int, aten.stride.default,
         aten.sym_stride.int, aten.storage_offset.default, aten.sym_storage_offset.default,
         aten.numel.default, aten.sym_numel.default, aten.dim.default, aten.is_contiguous.default,
         aten.is_contiguous.memory_format, aten.is_strides_like_format.default,
         aten.is_non_overlapping_and_dense.default}


def _flop_table() -> dict:
    from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count
    table = dict(flop_registry)
    # torch's CPU kernels for scaled_dot_product_attention, absent from flop_registry (torch 2.13
    # torch/utils/flop_counter.py lists only the CUDA/cuDNN/efficient variants). Same shapes
    # (batch, heads, seq, head_dim) as the variants it lists.
    sig = lambda t: t.shape  # noqa: E731

    def fwd(q, k, v, *a, out_val=None, **kw):
        return sdpa_flop_count(sig(q), sig(k), sig(v))

    def bwd(g, q, k, v, *a, out_val=None, **kw):
        return sdpa_backward_flop_count(sig(g), sig(q), sig(k), sig(v))
    table[aten._scaled_dot_product_flash_attention_for_cpu] = fwd
    table[aten._scaled_dot_product_flash_attention_for_cpu_backward] = bwd
    return table


_FLOPS: dict = {}


def op_flops(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """FLOPs of one aten op by torch.utils.flop_counter's formulas (0 for ops it has none for)."""
    if not _FLOPS:
        _FLOPS.update(_flop_table())
    formula = _FLOPS.get(func.overloadpacket)
    return int(formula(*args, **kwargs, out_val=out)) if formula is not None else 0


def _nbytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(y) for y in x)
    return 0


def op_bytes(args: tuple, kwargs: dict, out: Any) -> int:
    """Bytes an op moves: its tensor inputs' and outputs' nbytes (the approximation in the docstring)."""
    return _nbytes(args) + _nbytes(tuple(kwargs.values())) + _nbytes(out)
