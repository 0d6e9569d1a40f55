"""The chip efficiency matrix: what a chip sustains per op class and shape, the one source the planner's
cost model and timed emulation both charge work from (no single MFU constant).

    matrix = hal.core.catalog.matrix("cuda", "H100")     # defaults, each figure with its source
    matrix.gemm_fraction(8192, 8192, 8192)               # achieved / peak for an (m, n, k) GEMM
    matrix.best_fraction                                 # the highest fraction any op reaches (a bound)

Op classes (all fractions are of the catalog peak of the dtype the work runs in, or of its memory / link
bandwidth):
  - GEMM: `min(gemm_peak x s(m) s(n) s(k), gemm_max)`, s(x) = x / (x + gemm_half_dim): a saturating
    curve in each dimension (small dimensions cannot fill the tensor cores), anchored so that it passes
    through a published microbenchmark's best shape, and capped at that benchmark's maximum (`gemm_max`,
    optional: MAMF is the *maximum* achievable over its sweep of shapes, so the curve's rise beyond the
    best shape is the fit's form, not a measurement). A measured matrix (`hal conformance
    --level perf --efficiency FILE`) replaces the curve by its own points, interpolated (`with_measured`).
  - attention: fused (flash-style) attention forward + backward at `attention` x peak, on the work the
    kernel does: FlashAttention's and cuDNN's benchmarks rate a causal run on the causal count (half the
    4 s^2 d FLOPs of Q K^T and A V over every key: Dao-AILab/flash-attention benchmarks/
    benchmark_flash_attention.py at 0469c72723, `4 * batch * seqlen**2 * nheads * headdim // (2 if causal
    else 1)`), because the kernel skips the masked tiles. `fused_attention_share` is that work as a share of
    the full count (causal, sliding window); an unfused core computes the whole score matrix (share 1).
  - sustained load (`sustained`, optional, default 1): the share of the short-run compute rate a chip keeps
    once its power cap engages (seconds of dense matmuls); it scales the GEMM and attention fractions (and
    so the best fraction, the upper bound's rate) because the microbenchmarks above time short runs, and
    training keeps the chip busy for hours. Memory-bound ops are not scaled.
  - memory-bound ops (norms, activations, residuals, the optimizer, copies): `memory` x bandwidth.
  - collectives and point-to-point: alpha-beta, `intra_link` / `nic_link` x the link's line rate per
    byte plus `intra_latency_s` / `nic_latency_s` per message.
  - memory headroom: `memory_reserve_bytes` (runtime context, communication buffers) and
    `memory_fragmentation` (the caching allocator's unusable share) leave `usable_memory` for a plan.

Invariant checked at construction: no op class exceeds `best_fraction` (= min(gemm_peak, gemm_max)) on its own
work. A fused causal core does about half the work the model's FLOPs count for it, so per *counted* FLOP it
can run faster than `best_fraction`: the planner's upper bound prices attention's counted FLOPs at the faster
of the two (hal.strategies.planner.plan_search.bound_tokens_per_s), so that it stays a true bound.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional, Sequence

from hal.contract.errors import HalError

# the fields a catalog `[efficiency.<model>]` table gives, with their allowed ranges
FIELDS: dict[str, tuple[float, float]] = {
    "gemm_peak": (0.05, 1.0), "gemm_half_dim": (1.0, 65536.0), "attention": (0.01, 1.0),
    "memory": (0.05, 1.0), "intra_link": (0.05, 1.0), "nic_link": (0.05, 1.0),
    "intra_latency_s": (0.0, 1e-2), "nic_latency_s": (0.0, 1e-2),
    "memory_reserve_bytes": (0.0, 64e9), "memory_fragmentation": (0.0, 0.5), "gemm_max": (0.05, 1.0),
    "sustained": (0.05, 1.0),
}
OPTIONAL = {"gemm_max", "sustained"}      # fields a table may leave out (gemm_max None: no cap; sustained: 1)


class ChipMatrixError(HalError, ValueError):
    """A chip efficiency matrix is malformed: the message names the chip, model, field and value."""


@dataclass(frozen=True)
class ChipMatrix:
    """Sustained efficiency of one chip model per op class (module docstring), each figure sourced."""

    chip: str
    model: str
    gemm_peak: float
    gemm_half_dim: float
    attention: float         # fused attention's fraction of peak on the work it does (causal: about half the count)
    memory: float
    intra_link: float
    nic_link: float
    intra_latency_s: float
    nic_latency_s: float
    memory_reserve_bytes: float
    memory_fragmentation: float
    sources: Mapping[str, str] = field(default_factory=dict)
    # measured GEMMs (cube root of m n k, fraction of peak), ascending: replace the curve when present
    measured_gemm: tuple[tuple[float, float], ...] = ()
    origin: str = "catalog"
    # the benchmark's measured maximum: no GEMM of the curve exceeds it (None: the curve's asymptote)
    gemm_max: Optional[float] = None
    # the share of its short-run compute rate the chip keeps under sustained load (its power cap engages
    # after seconds of dense matmuls): scales every compute fraction (GEMM, attention, best), not memory
    sustained: float = 1.0

    def __post_init__(self) -> None:
        for name, (lo, hi) in FIELDS.items():
            v = getattr(self, name)
            if v is None and name in OPTIONAL:
                continue
            if not (isinstance(v, (int, float)) and math.isfinite(v) and lo <= v <= hi):
                raise ChipMatrixError(f"efficiency matrix {self.chip} {self.model}: {name} = {v!r} is outside "
                                      f"[{lo:g}, {hi:g}]")
        if self.attention_rate > self.best_fraction + 1e-12:
            raise ChipMatrixError(f"efficiency matrix {self.chip} {self.model}: attention = {self.attention} exceeds "
                                  f"the best GEMM fraction {self.best_fraction}; no op class may exceed it "
                                  f"(the upper bound on a plan's throughput rests on that)")

    @property
    def best_fraction(self) -> float:
        """The highest fraction of peak any op sustains: the asymptote of the curve (or the best measured
        GEMM) x `sustained`."""
        if self.measured_gemm:
            return max(f for _, f in self.measured_gemm) * self.sustained
        return (min(self.gemm_peak, self.gemm_max) if self.gemm_max is not None else self.gemm_peak) * self.sustained

    @property
    def attention_rate(self) -> float:
        """Fused attention's sustained fraction of peak on the work it does: `attention` x `sustained`."""
        return self.attention * self.sustained

    def gemm_fraction(self, m: float, n: float, k: float) -> float:
        """Achieved / peak FLOP/s of an (m, n, k) GEMM (2 m n k FLOPs): the curve, or the measured points
        interpolated in log(cube root of m n k) and clamped at both ends."""
        if min(m, n, k) <= 0:
            return self.best_fraction
        if self.measured_gemm:
            g = math.log((m * n * k) ** (1 / 3))
            pts = [(math.log(x), f) for x, f in self.measured_gemm]
            if g <= pts[0][0]:
                return pts[0][1] * self.sustained
            for (x0, f0), (x1, f1) in zip(pts, pts[1:]):
                if g <= x1:
                    return (f0 + (f1 - f0) * (g - x0) / (x1 - x0) if x1 > x0 else f1) * self.sustained
            return pts[-1][1] * self.sustained
        h = self.gemm_half_dim
        curve = self.gemm_peak * (m / (m + h)) * (n / (n + h)) * (k / (k + h)) * self.sustained
        return min(self.best_fraction, curve)

    def usable_memory(self, capacity: float) -> float:
        """Bytes a plan may use of `capacity`: less the fragmentation share and the runtime reserve."""
        return max(0.0, capacity * (1 - self.memory_fragmentation) - self.memory_reserve_bytes)

    def with_measured(self, measured: Any, peak: Optional[float], memory_bw: Optional[float],
                      where: str) -> "ChipMatrix":
        """This matrix with the figures an `hal.core.efficiency.EfficiencyMatrix` measured (the perf level):
        its matmuls (dtype bfloat16, else float16) as fractions of `peak` replace the GEMM curve, its
        sustained matmul run (native chips only) the `sustained` share, its device-copy bandwidth over
        `memory_bw` the memory fraction. Figures it lacks stay as they were."""
        out: dict[str, Any] = {}
        src = dict(self.sources)
        pts = [f for f in measured.matmul if f.dtype == "bfloat16"] or [f for f in measured.matmul
                                                                         if f.dtype == "float16"]
        if pts and peak:
            by: dict[float, float] = {}
            for f in pts:
                g = (f.m * f.n * f.k) ** (1 / 3)
                by[g] = max(by.get(g, 0.0), min(1.0, f.flops_per_s / peak))
            out["measured_gemm"] = tuple(sorted(by.items()))
            src["gemm_peak"] = src["gemm_half_dim"] = f"measured: {where} ({len(pts)} matmul shapes)"
            out["attention"] = min(self.attention, max(by.values()))
        kept = getattr(measured, "sustained_matmul", None)
        if kept is not None and not measured.emulated:
            out["sustained"] = kept.sustained
            src["sustained"] = (f"measured: {where} ({kept.dtype} {kept.m}^3 back to back for "
                                f"{kept.duration_s:.0f} s: {kept.seconds_short * 1e3:.3g} ms per round at first, "
                                f"{kept.seconds_sustained * 1e3:.3g} ms kept)")
        bw = measured.memory_bytes_per_s()
        if bw and memory_bw:
            out["memory"] = min(1.0, max(0.05, bw / memory_bw))
            src["memory"] = f"measured: {where} (device copy {bw / 1e9:.0f} GB/s)"
        return replace(self, **out, sources=src, origin=f"measured: {where}")


def matrix_from_table(chip: str, model: str, raw: Mapping[str, Any], sources: Mapping[str, str],
                      where: str) -> ChipMatrix:
    """A `ChipMatrix` from a catalog table: every field `{ value, src, where, note }` with `src` a key of
    the file's [sources] (the source text is kept per field). ChipMatrixError names what is wrong."""
    missing = sorted(set(FIELDS) - set(raw) - OPTIONAL)
    extra = sorted(set(raw) - set(FIELDS))
    if missing or extra:
        raise ChipMatrixError(f"{where}: missing field(s) {missing}, unknown field(s) {extra}; "
                              f"expected {sorted(FIELDS)}")
    vals: dict[str, float] = {}
    srcs: dict[str, str] = {}
    for name in FIELDS:
        if name not in raw:
            continue
        item = raw[name]
        if not isinstance(item, Mapping) or "value" not in item or item.get("src") not in sources:
            raise ChipMatrixError(f"{where}.{name}: expected {{ value, src, where, note }} with src one of "
                                  f"{sorted(sources)}, got {item!r}")
        vals[name] = float(item["value"])
        srcs[name] = sources[item["src"]] + (f"; at: {item['where']}" if item.get("where") else "") + \
            (f" ({item['note']})" if item.get("note") else "")
    return ChipMatrix(chip, model, vals["gemm_peak"], vals["gemm_half_dim"], vals["attention"], vals["memory"],
                      vals["intra_link"], vals["nic_link"], vals["intra_latency_s"], vals["nic_latency_s"],
                      vals["memory_reserve_bytes"], vals["memory_fragmentation"], sources=srcs,
                      gemm_max=vals.get("gemm_max"), sustained=vals.get("sustained", 1.0))


def fused_attention_share(q_len: int, k_len: Optional[int] = None, causal: bool = True,
                          window: Optional[int] = None) -> float:
    """The score elements a fused attention kernel computes, as a share of the full q_len x k_len count
    (the model-FLOPs convention, 4 s d per query and head forward). Causal (torch's is_causal: query i sees
    keys 0..i) with an optional sliding window of `window` keys (itself and window - 1 before it): query i
    computes min(i + 1, window, k_len) elements, so q_len = k_len = s costs s(s + 1)/2 of s^2 (about half:
    the count FlashAttention's and cuDNN's benchmarks rate causal runs on), and a window W costs
    W(W + 1)/2 + (s - W) W of s^2. Not causal: 1 (a window without causal masking is not modelled)."""
    k_len = q_len if k_len is None else k_len
    if q_len <= 0 or k_len <= 0:
        raise ChipMatrixError(f"fused_attention_share: q_len = {q_len}, k_len = {k_len}; both must be >= 1")
    if window is not None and window < 1:
        raise ChipMatrixError(f"fused_attention_share: window = {window}; it must be >= 1 (None: no window)")
    if not causal:
        return 1.0
    c = min(k_len, window if window is not None else k_len)
    n = min(q_len, c)
    elements = n * (n + 1) / 2 + (q_len - n) * c
    return elements / (q_len * k_len)


def gemm_shapes(tokens: float, hidden: int, ffn: int, q_dim: int, kv_dim: int, tp: int) -> Sequence[tuple]:
    """The forward GEMMs of one dense decoder block over `tokens` tokens on one of `tp` TP ranks, as
    (m, n, k) with 2 m n k FLOPs each: fused QKV, attention output, SwiGLU w1 and w3, w2 (Megatron's
    column / row parallel split of n or k)."""
    t = tokens
    return ((t, (q_dim + 2 * kv_dim) / tp, hidden), (t, hidden, q_dim / tp),
            (t, ffn / tp, hidden), (t, ffn / tp, hidden), (t, hidden, ffn / tp))
