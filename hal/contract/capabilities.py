"""The capability matrix: which collective x dtype x reduce op a chip's CCL does natively."""
from __future__ import annotations

from typing import Iterable, Optional

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, Field

from hal.contract.errors import NotSupportedError

# Collectives with torch.distributed's names. Reducing ones take a reduce op.
REDUCING = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor")
NON_REDUCING = ("broadcast", "all_gather", "all_gather_into_tensor", "all_to_all",
                "all_to_all_single", "gather", "scatter", "send_recv", "barrier")
COLLECTIVES = REDUCING + NON_REDUCING
REDUCE_OPS = ("sum", "avg", "max", "min", "product", "premul_sum", "band", "bor", "bxor")
DTYPES = ("float32", "float16", "bfloat16", "float64", "int8", "uint8", "int16", "int32", "int64",
          "bool", "float8_e4m3fn", "float8_e5m2")

_TORCH_DTYPES = {name: getattr(torch, name) for name in DTYPES}
# reduce-op name -> torch's ReduceOp: the one name table (bridge, conformance, capability measurement,
# tests). premul_sum is not here: it needs a factor (dist._make_nccl_premul_sum(factor)).
TORCH_REDUCE_OPS = {name: getattr(dist.ReduceOp, name.upper()) for name in REDUCE_OPS if name != "premul_sum"}


def dtype_name(dtype: torch.dtype) -> str:
    """'float32' for torch.float32; the key the matrix uses."""
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    """torch.float32 for 'float32'; any name in DTYPES (the one dtype name table)."""
    if name not in _TORCH_DTYPES:
        raise NotSupportedError(f"dtype {name!r} is not one of the matrix's dtypes {list(DTYPES)}")
    return _TORCH_DTYPES[name]


def torch_reduce_op(name: str) -> "dist.ReduceOp":
    """dist.ReduceOp.SUM for 'sum'; any name in REDUCE_OPS but premul_sum (which needs a factor)."""
    if name not in TORCH_REDUCE_OPS:
        raise NotSupportedError(f"reduce op {name!r}: expected one of {list(TORCH_REDUCE_OPS)} (premul_sum "
                                f"needs a factor: dist._make_nccl_premul_sum)")
    return TORCH_REDUCE_OPS[name]


def reduce_op_name(op) -> str:
    """'sum' for dist.ReduceOp.SUM (or its RedOpType), for any spelling torch gives."""
    text = str(op).split(".")[-1].lower()
    return {"prod": "product"}.get(text, text)


class CapabilityMatrix(BaseModel):
    """Native support, as a set of (collective, dtype, reduce op) entries.

    Non-reducing collectives use reduce op "-". `source` says how the matrix was obtained
    (measured on hardware, read from the vendor's source, ...) so a reader can judge it.
    """

    model_config = ConfigDict(frozen=True)

    chip: str
    entries: frozenset[tuple[str, str, str]] = Field(default_factory=frozenset)
    source: str = ""

    @classmethod
    def build(cls, chip: str, source: str, *, collectives: Iterable[str] = COLLECTIVES,
              dtypes: Iterable[str] = DTYPES, reduce_ops: Iterable[str] = REDUCE_OPS,
              exclude: Iterable[tuple[str, str, str]] = ()) -> "CapabilityMatrix":
        """Every combination of the given names, minus `exclude` ("*" in an exclude is a wildcard)."""
        excl = list(exclude)
        ops = tuple(reduce_ops)
        out = set()
        for c in collectives:
            if c not in COLLECTIVES:
                raise ValueError(f"unknown collective {c!r}; known: {COLLECTIVES}")
            for d in dtypes:
                if d not in DTYPES:
                    raise ValueError(f"unknown dtype {d!r}; known: {DTYPES}")
                for o in (ops if c in REDUCING else ("-",)):
                    if not any(_match(e, (c, d, o)) for e in excl):
                        out.add((c, d, o))
        return cls(chip=chip, entries=frozenset(out), source=source)

    def supports(self, collective: str, dtype: str, reduce_op: Optional[str] = None) -> bool:
        return (collective, dtype, reduce_op or "-") in self.entries

    def check(self, collective: str, dtype: str, reduce_op: Optional[str] = None) -> None:
        """Raise `NotSupportedError` naming the chip and the combination if it is not native."""
        if not self.supports(collective, dtype, reduce_op):
            what = f"{collective} dtype={dtype}" + (f" op={reduce_op}" if reduce_op else "")
            raise NotSupportedError(f"chip {self.chip!r}: {what} is not supported natively ({self.source})")

    def intersect(self, other: "CapabilityMatrix", chip: Optional[str] = None,
                  source: Optional[str] = None) -> "CapabilityMatrix":
        return CapabilityMatrix(chip=chip or self.chip, entries=self.entries & other.entries,
                                source=source or f"{self.source} ∩ {other.source}")

    def table(self) -> dict[str, dict[str, list[str]]]:
        """{collective: {dtype: [ops]}} for reports and JSON."""
        out: dict[str, dict[str, list[str]]] = {}
        for c, d, o in sorted(self.entries):
            out.setdefault(c, {}).setdefault(d, []).append(o)
        return out


def _match(pattern: tuple[str, str, str], entry: tuple[str, str, str]) -> bool:
    return all(p == "*" or p == e for p, e in zip(pattern, entry))
