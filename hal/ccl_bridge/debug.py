"""HAL_BRIDGE_DEBUG=1: before each collective, check that every rank is calling the same one.

In the spirit of TORCH_DISTRIBUTED_DEBUG=DETAIL: each rank packs (sequence number, op, dtype,
shape, root, reduce op) into a small int64 fingerprint; the fingerprints are all-gathered over the
group's global gloo group (one extra small collective per call, hence opt-in) and compared. On any
disagreement every rank raises `BridgeMismatchError` listing each rank's values, e.g.

    collective mismatch at #3 on group '0': rank 0: all_reduce float32 shape (4,) op sum;
    rank 1: all_reduce float32 shape (5,) op sum

Shapes are compared only for collectives whose torch semantics require equal shapes (not for
all_to_all with uneven splits).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from hal.contract.capabilities import DTYPES, dtype_name, torch_dtype

from .errors import BridgeMismatchError

OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
       "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather", "scatter", "barrier",
       "all_reduce_coalesced", "all_gather_coalesced", "reduce_scatter_coalesced")
REDOPS = ("-", "sum", "avg", "product", "min", "max", "band", "bor", "bxor", "premul_sum")
MAX_DIMS = 6
WIDTH = 7 + MAX_DIMS


def _dtype_code(dtype: Optional[torch.dtype]) -> int:
    """A code from the dtype's name (the same on every rank and process)."""
    if dtype is None:
        return -1
    return sum(ord(ch) * (31 ** i) for i, ch in enumerate(dtype_name(dtype))) % (2 ** 31)


@dataclass(frozen=True)
class Fingerprint:
    seq: int
    op: str
    dtype: Optional[torch.dtype]
    shape: Optional[tuple[int, ...]]
    root: int = -1
    redop: str = "-"
    check_shape: bool = True

    def pack(self) -> torch.Tensor:
        shape = tuple(self.shape or ())
        dims = list(shape[:MAX_DIMS]) + [-1] * (MAX_DIMS - min(len(shape), MAX_DIMS))
        numel = 1
        for d in shape:
            numel *= d
        known = self.shape is not None
        return torch.tensor([self.seq, OPS.index(self.op), _dtype_code(self.dtype), len(shape) if known else -1,
                             numel if known else -1, self.root, REDOPS.index(self.redop)] + dims,
                            dtype=torch.int64)

    def describe(self) -> str:
        parts = [self.op, dtype_name(self.dtype) if self.dtype is not None else "-"]
        if self.shape is not None:
            parts.append(f"shape {tuple(self.shape)}")
        if self.root >= 0:
            parts.append(f"root {self.root}")
        if self.redop != "-":
            parts.append(f"op {self.redop}")
        parts.append(f"#{self.seq}")
        return " ".join(parts)


def _decode(row: Sequence[int], dtype_names: dict) -> str:
    seq, op, dt, ndim, numel, root, red = (int(x) for x in row[:7])
    dims = [int(x) for x in row[7:]]
    shape: Optional[tuple] = tuple(dims[:ndim]) if ndim >= 0 else None
    if ndim > MAX_DIMS:
        shape = tuple(dims) + ("...",)
    text = f"{OPS[op] if 0 <= op < len(OPS) else op} {dtype_names.get(dt, dt)}"
    if shape is not None:
        text += f" shape {shape}"
    if root >= 0:
        text += f" root {root}"
    if 0 < red < len(REDOPS):
        text += f" op {REDOPS[red]}"
    return text + f" #{seq}"


def check(fx, fp: Fingerprint) -> None:
    """All-gather fingerprints over the global gloo group; raise on any disagreement."""
    mine = fp.pack()
    allfp = torch.empty(fx.world * WIDTH, dtype=torch.int64)
    fx.glob.all_gather_into_tensor(allfp, mine).wait()
    rows = allfp.view(fx.world, WIDTH)
    ref = rows[0]
    cols = list(range(0, 3)) + [5, 6]
    if fp.check_shape:
        cols += [3, 4] + list(range(7, WIDTH))
    bad = [r for r in range(fx.world) if not torch.equal(rows[r][cols], ref[cols])]
    if not bad:
        return
    names = {_dtype_code(d): dtype_name(d) for d in _KNOWN}
    desc = "; ".join(f"rank {fx.global_rank(r)}: {_decode(rows[r].tolist(), names)}" for r in range(fx.world))
    raise BridgeMismatchError(f"HAL_BRIDGE_DEBUG: collective mismatch at #{fp.seq} on group {fx.name!r}: {desc}",
                              op=fp.op, seq=fp.seq, group=fx.name, stage="debug agreement check")


# hal's dtype names (hal.contract.capabilities.DTYPES), and the complex dtypes a mismatch report may meet
_KNOWN = [torch_dtype(n) for n in DTYPES] + [torch.complex64, torch.complex128]
