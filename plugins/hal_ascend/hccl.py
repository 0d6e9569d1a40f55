"""HCCL as torch_npu's ProcessGroupHCCL really offers it: capability matrix, timeouts, group creation.

Sources (Ascend/pytorch master, commit 9e73e708, which builds torch_npu for torch 2.13-2.15):
- torch_npu/csrc/distributed/ProcessGroupHCCL.cpp: `hcclOp` maps MIN, MAX, SUM, PRODUCT; BAND, BOR,
  BXOR raise "Cannot use ReduceOp.BAND with HCCL"; AVG is a SUM followed by `tensor.div_(size)` on the
  PG's stream, which fails for integer tensors (true division into an int tensor) except on
  Ascend950, so AVG is declared for floating dtypes only; PREMUL_SUM multiplies first and accepts
  half, float, bfloat16, double; bool SUM becomes MAX. `checkSupportedDataType` limits the
  reductions (allreduce, reduce, reduce_scatter, _reduce_scatter_base) to int8, int16, int32, int64,
  float16, float32, bfloat16 (uint64/float64 only on Ascend950); allreduce and reduce first cast
  bool and uint8 to int32 (so they reduce too), reduce_scatter does not. AllGather and Broadcast
  "support all data type", as do all_to_all, scatter and send/recv: every dtype in
  `kScalarTypeToHcclDataType` (torch_npu/csrc/distributed/HCCLUtils.cpp), which includes
  float64 and float8_e4m3fn/e5m2 (the float8 entries are new in master; v7.3.0 lacked them).
- gather: HCCL has no gather primitive. torch_npu's `dist.gather` replaces it with all_gather
  (torch_npu/distributed/distributed_c10d.py `_gather`, "Npu replaces gather with all_gather in
  default mode"); the PG's own `gather` raises in v7.3.0 and is send/recv-based only in master.
  So gather is *not* declared native: the HAL bridge builds it from all_gather.
- creation: torch_npu/_init/registry/distributed.py `_new_process_group_hccl_helper`:
  `ProcessGroupHCCL.Options()`, `is_high_priority_stream = False`, `_timeout = timeout`,
  `group_id`, then `ProcessGroupHCCL(store, group_rank, group_size, options)`.

Timeouts. HCCL keeps two of its own, read from the environment when a communicator is built:
HCCL_CONNECT_TIMEOUT (link setup; integer seconds in [120, 7200], default 120: CANN env reference
envref_07_0077) and HCCL_EXEC_TIMEOUT (how long a device waits for its peers inside a collective;
default 1836 s; Atlas A2/A3 accept [0, 2^31-1], Atlas training products (0, 17340] and round the
value *down* to a multiple of 68 s: CANN envref_07_0078). We derive both from the HAL timeout T and
set them in os.environ before constructing the group (HCCL reads them through getenv then; the
Python process environment is the C environment):
  HCCL_EXEC_TIMEOUT    = clamp(ceil(T / 68) * 68, 68, 17340)  -- a multiple of 68 is exact everywhere
  HCCL_CONNECT_TIMEOUT = clamp(ceil(T), 120, 7200)
so HCCL never gives up before the HAL does, and ProcessGroupHCCL's watchdog (options._timeout = T)
raises at T. torch_npu reads HCCL_EXEC_TIMEOUT once per process (a function-static in
WorkHCCL::checkExec and a call_once for the op-wait timeout), so a later group with another timeout
keeps the first value; we warn when that happens.
"""
from __future__ import annotations

import itertools
import math
import os
import warnings
from datetime import timedelta
from typing import Any, MutableMapping, Optional

import hal
from hal.capabilities import COLLECTIVES, REDUCING

HCCL_EXEC_STEP_S = 68
HCCL_EXEC_MAX_S = 17340  # Atlas training products' maximum (= 255 x 68); A2/A3 allow more
HCCL_CONNECT_MIN_S, HCCL_CONNECT_MAX_S = 120, 7200

_REDUCE_DTYPES = ("int8", "int16", "int32", "int64", "float16", "float32", "bfloat16")
_CAST_TO_INT32 = ("bool", "uint8")  # allreduce / reduce only
_FLOAT_REDUCE = ("float16", "float32", "bfloat16")
_MOVE_DTYPES = ("uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "bool",
                "bfloat16", "float8_e4m3fn", "float8_e5m2")
_NOT_NATIVE = ("gather",)

SOURCE = ("read from Ascend/pytorch@9e73e708 torch_npu/csrc/distributed/ProcessGroupHCCL.cpp "
          "(hcclOp, getHcclReduceOp, checkSupportedDataType), HCCLUtils.cpp (kScalarTypeToHcclDataType), "
          "torch_npu/distributed/distributed_c10d.py (_gather via all_gather)")


def hccl_capabilities(chip: str = "ascend") -> hal.CapabilityMatrix:
    entries: set[tuple[str, str, str]] = set()
    for coll in COLLECTIVES:
        if coll in _NOT_NATIVE:
            continue
        if coll not in REDUCING:
            entries.update((coll, d, "-") for d in _MOVE_DTYPES)
            continue
        dtypes = _REDUCE_DTYPES + (_CAST_TO_INT32 if coll in ("all_reduce", "reduce") else ())
        for d in dtypes:
            ops = ["sum", "max", "min", "product"]
            if d in _FLOAT_REDUCE:
                ops += ["avg", "premul_sum"]
            entries.update((coll, d, op) for op in ops)
    return hal.CapabilityMatrix(chip=chip, entries=frozenset(entries), source=SOURCE)


def hccl_timeout_env(timeout: timedelta) -> dict[str, str]:
    """The HCCL timeout variables for HAL timeout `timeout` (see the module docstring)."""
    secs = timeout.total_seconds()
    if secs <= 0:
        raise ValueError(f"HCCL timeouts: the HAL timeout must be positive, got {timeout!r}")
    exec_s = math.ceil(secs / HCCL_EXEC_STEP_S) * HCCL_EXEC_STEP_S
    exec_s = min(HCCL_EXEC_MAX_S, max(HCCL_EXEC_STEP_S, exec_s))
    connect_s = min(HCCL_CONNECT_MAX_S, max(HCCL_CONNECT_MIN_S, math.ceil(secs)))
    return {"HCCL_EXEC_TIMEOUT": str(exec_s), "HCCL_CONNECT_TIMEOUT": str(connect_s)}


_applied: dict[str, str] = {}  # what this process first gave HCCL (torch_npu keeps it)


def apply_hccl_timeouts(timeout: timedelta, env: Optional[MutableMapping[str, str]] = None) -> dict[str, str]:
    """Set the HCCL timeout variables for `timeout` in `env` (default os.environ), warning when a
    value the user set is replaced or when torch_npu will keep an earlier group's value."""
    env = os.environ if env is None else env
    want = hccl_timeout_env(timeout)
    secs = timeout.total_seconds()
    if secs > HCCL_EXEC_MAX_S:
        warnings.warn(f"HAL timeout {secs:.0f} s exceeds HCCL_EXEC_TIMEOUT's portable maximum "
                      f"{HCCL_EXEC_MAX_S} s; HCCL may time out first", RuntimeWarning, stacklevel=3)
    for name, value in want.items():
        old = env.get(name)
        if name in _applied and _applied[name] != value:
            warnings.warn(f"{name}: torch_npu read {_applied[name]} for this process's first HCCL group "
                          f"and keeps it; this group asked for {value}", RuntimeWarning, stacklevel=3)
        elif old is not None and old != value and name not in _applied:
            warnings.warn(f"{name}={old} (set in the environment) replaced by {value}, derived from the "
                          f"HAL collective timeout {secs:g} s", RuntimeWarning, stacklevel=3)
        env[name] = value
        _applied.setdefault(name, value)
    return want


_group_ids = itertools.count()


def create_hccl_process_group(store: Any, rank: int, world_size: int, timeout: timedelta,
                              chip: str = "ascend") -> Any:
    """torch_npu's ProcessGroupHCCL with the HAL timeout (HCCL's own timeouts set first)."""
    if not isinstance(timeout, timedelta) or timeout.total_seconds() <= 0:
        raise ValueError(f"chip {chip!r}, hook 'hal_create_process_group': timeout must be a positive "
                         f"datetime.timedelta, got {timeout!r}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"chip {chip!r}, hook 'hal_create_process_group': rank {rank} is not in "
                         f"[0, world_size={world_size})")
    try:
        import torch_npu
        pg_class = torch_npu._C._distributed_c10d.ProcessGroupHCCL
    except (ImportError, AttributeError) as exc:
        raise hal.ChipUnavailableError(f"chip {chip!r}, hook 'hal_create_process_group': torch_npu's "
                                       f"ProcessGroupHCCL is unavailable: {type(exc).__name__}: {exc}") from exc
    apply_hccl_timeouts(timeout)  # before the communicator exists: HCCL reads them at creation
    options = pg_class.Options()
    options.is_high_priority_stream = False
    options._timeout = timeout
    # group_id names the group (setGroupName("group_name_" + group_id)); every rank creates the
    # HAL's groups in the same order, so a per-process counter agrees across ranks.
    options.group_id = f"hal_hccl_{next(_group_ids)}"
    return pg_class(store, rank, world_size, options)
