"""NCCL as torch's ProcessGroupNCCL really offers it: the capability matrix and group creation.

Every entry below is read from PyTorch's source, not guessed:

- dtypes: `ncclDataType` in torch/csrc/distributed/c10d/NCCLUtils.hpp (pytorch/pytorch main):
  int8, uint8, int32, int64, float16, float32, float64, bfloat16, bool (sent as ncclUint8) and
  float8_e4m3fn / float8_e5m2 (native NCCL fp8 types from NCCL 2.24, `NCCL_SUPPORTS_FP8`, else moved
  as ncclUint8). int16 is absent from the map, so every collective on int16 raises
  "Input tensor data type is not supported for NCCL process group".
- reduce ops: `ncclOp` and `getNcclReduceOp` in torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:
  SUM, PRODUCT, MIN, MAX always; AVG with NCCL >= 2.10 (`NCCL_HAS_AVG`); PREMUL_SUM with NCCL >= 2.11
  (`ENABLE_NCCL_PREMUL_SUM_SUPPORT`) and only for half, float, bfloat16, double ("PreMulSum Data type
  must be half, float, bfloat16 or double"); BAND/BOR/BXOR raise "Cannot use ReduceOp.BAND with NCCL".
  bool: SUM is mapped to MAX (a logical or, to avoid uint8 overflow); AVG on bool raises TypeError.
- float8 reductions: `isUnsupportedFloat8` rejects e4m3fn/e5m2 unless NCCL_SUPPORTS_FP8 (NCCL >= 2.24);
  NCCL's own type table (docs/api/types: ncclFloat8e4m3 "CUDA >= 11.8 and SM >= 90") adds the
  compute-capability floor. PREMUL_SUM on float8 falls in the TypeError branch above.
- collectives: ProcessGroupNCCL implements every torch.distributed collective natively, gather,
  scatter and the list form of all_to_all as grouped ncclSend/ncclRecv, barrier as a 1-element
  all_reduce.

Group creation follows torch/distributed/distributed_c10d.py `_new_process_group_helper` (torch 2.13,
pytorch/pytorch v2.13.0 git cf30153c): `ProcessGroupNCCL.Options()` with `is_high_priority_stream =
False`, `_timeout = timeout`, `global_ranks_in_group` and `group_name` (the HAL hook's `global_ranks` and
`group_name`), then `ProcessGroupNCCL(store, group_rank, group_size, options)` and
`_set_sequence_number_for_group()`. The class is the one that helper constructs
(`distributed_c10d.ProcessGroupNCCL`).

What a timeout does (torch 2.13.0, pytorch/pytorch git cf30153c: the variable names and defaults are
those of the installed torch/include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp; the behaviour
is ProcessGroupNCCL.cpp `Watchdog::runLoop`, `HeartbeatMonitor::runLoop`, `WorkNCCL::wait` and
`abort`, read from pytorch/pytorch main as indexed):
1. The constructor reads TORCH_NCCL_ASYNC_ERROR_HANDLING; its default 3 (SkipCleanUp) makes the
   watchdog *kill the process* when a collective outlives `options._timeout`, which no caller can
   catch. Before building the group we set it to 2 (CleanUpOnly: the watchdog aborts the
   communicators and leaves the process alive) unless the user chose a value (a teardown mode is
   warned about).
2. Whatever that mode, the watchdog first calls `broadcastDumpSignal()`: it writes `exception_dump`
   into the job's store (every rank sees it) and sets the process-wide `shouldDump_`. The heartbeat
   monitor of each rank's *first* NCCL group (uid 0), when TORCH_NCCL_DUMP_ON_TIMEOUT is on (default
   true), polls both; once one is set it dumps the flight recorder, sleeps
   TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC (default 480 s) and then terminates the process (std::abort)
   unless that group was aborted or shut down meanwhile, or TORCH_NCCL_ENABLE_MONITORING=0. So a
   timeout on one rank kills every survivor minutes after it raised. Before the first group exists we
   set TORCH_NCCL_DUMP_ON_TIMEOUT=0 (the monitor reads it in each group's constructor, and only uid
   0's matters) unless the user chose a value (1 is warned about): the monitor then only checks the
   watchdog's heartbeat, which a CleanUpOnly watchdog keeps beating. The flight recorder can still be
   dumped on demand (torch's dump pipe). Monitoring itself stays on: it also catches a hung watchdog.
   Besides, the hetero bridge aborts the device groups of every hetero group of the process when one
   of them fails (hal.ccl_bridge.process_group), which stops those groups' monitors too.
3. The bridge waits on NCCL works with `work.wait(timeout)`: `WorkNCCL::wait` blocks the calling
   thread until the work completes or the timeout passes, then aborts the work's communicator and
   raises DistBackendError (a RuntimeError), which `hal.ccl_bridge.ccl.Handle` turns into a typed
   bridge error. A caller outside the bridge that calls `work.wait()` without a timeout (torch's
   default, non-blocking) only orders streams; set TORCH_NCCL_BLOCKING_WAIT=1 to make that wait on the
   host too.
"""
from __future__ import annotations

import os
import warnings
from datetime import timedelta
from typing import Any, Optional, Sequence

from hal import sdk

FP8 = ("float8_e4m3fn", "float8_e5m2")
_FLOATS = ("float32", "float16", "bfloat16", "float64")
_INTS = ("int8", "uint8", "int32", "int64")
NCCL_AVG_MIN = (2, 10)
NCCL_PREMUL_SUM_MIN = (2, 11)
NCCL_FP8_MIN = (2, 24)
FP8_MIN_SM = (9, 0)
# torch wheels have bundled NCCL >= 2.10 since torch 1.13, so AVG and PREMUL_SUM are declared when
# the version cannot be read (at plugin validation, before any device is touched).
_ASSUMED_NCCL = (2, 11)

SOURCE = ("read from pytorch/pytorch torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (ncclOp, "
          "getNcclReduceOp, isUnsupportedFloat8) and NCCLUtils.hpp (ncclDataType); NCCL docs api/types")


def nccl_capabilities(chip: str = "cuda", nccl_version: Optional[tuple[int, ...]] = None,
                      compute_capability: Optional[tuple[int, int]] = None) -> sdk.CapabilityMatrix:
    """The matrix for a given NCCL version and GPU compute capability (None: not known yet).

    float8 reductions are declared only when both are known and high enough (NCCL >= 2.24, SM >= 9.0).
    """
    version = tuple(nccl_version[:2]) if nccl_version else _ASSUMED_NCCL
    entries: set[tuple[str, str, str]] = set()
    fp8_reduce = (nccl_version is not None and compute_capability is not None
                  and version >= NCCL_FP8_MIN and tuple(compute_capability) >= FP8_MIN_SM)
    for coll in sdk.COLLECTIVES:
        for dtype in sdk.DTYPES:
            if dtype == "int16":
                continue  # not in ncclDataType: every collective raises TypeError
            if coll not in sdk.REDUCING:
                entries.add((coll, dtype, "-"))
                continue
            for op in _reduce_ops(dtype, version, fp8_reduce):
                entries.add((coll, dtype, op))
    detail = (f"NCCL {'.'.join(map(str, nccl_version))}" if nccl_version
              else f"NCCL assumed >= {version[0]}.{version[1]}")
    cc = f", SM {compute_capability[0]}.{compute_capability[1]}" if compute_capability else ", SM unknown"
    return sdk.CapabilityMatrix(chip=chip, entries=frozenset(entries), source=f"{SOURCE}; {detail}{cc}")


def _reduce_ops(dtype: str, version: tuple[int, ...], fp8_reduce: bool) -> tuple[str, ...]:
    base = ("sum", "product", "min", "max")
    avg = ("avg",) if version >= NCCL_AVG_MIN else ()
    if dtype == "bool":
        return base  # SUM becomes MAX; AVG and PREMUL_SUM raise TypeError
    if dtype in FP8:
        return base + avg if fp8_reduce else ()
    if dtype in _INTS:
        return base + avg  # NCCL's avg on integers divides after the sum (truncating)
    if dtype in _FLOATS:
        return base + avg + (("premul_sum",) if version >= NCCL_PREMUL_SUM_MIN else ())
    return ()


def nccl_version() -> Optional[tuple[int, ...]]:
    """The NCCL version torch was built with, or None on a build without NCCL."""
    try:
        import torch.cuda.nccl as nccl
        v = nccl.version()
    except Exception:  # CPU-only builds have no torch._C._nccl_version
        return None
    return tuple(v) if isinstance(v, tuple) else None


ASYNC_ERROR_HANDLING_ENV = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
CLEAN_UP_ONLY = "2"  # ErrorHandlingMode::CleanUpOnly (0 none, 1 TearDown, 2 CleanUpOnly, 3 SkipCleanUp)
DUMP_ON_TIMEOUT_ENV = "TORCH_NCCL_DUMP_ON_TIMEOUT"
_TRUE = ("1", "true", "y", "yes")  # c10d's getCvarBool


def ensure_catchable_timeouts(env_names: tuple[str, ...] = (ASYNC_ERROR_HANDLING_ENV,), ccl: str = "NCCL",
                              dump_env_names: tuple[str, ...] = (DUMP_ON_TIMEOUT_ENV,)) -> None:
    """Make a collective timeout an exception that leaves every rank alive rather than a process
    teardown (see the module docstring, points 1 and 2); read by the process group's constructor, so
    call this before building it."""
    for name in env_names:
        value = os.environ.get(name)
        if value is None:
            os.environ[name] = CLEAN_UP_ONLY
        elif value.strip() in ("1", "3"):
            warnings.warn(f"{name}={value} (set in the environment): when a {ccl} collective outlives the "
                          f"HAL timeout the watchdog tears the process down, so the bridge cannot report "
                          f"which op and rank failed; {name}={CLEAN_UP_ONLY} raises an error instead",
                          RuntimeWarning, stacklevel=3)
    for name in dump_env_names:
        value = os.environ.get(name)
        if value is None:
            os.environ[name] = "0"
        elif value.strip().lower() in _TRUE:
            warnings.warn(f"{name}={value} (set in the environment): after a {ccl} collective times out on any "
                          f"rank, the heartbeat monitor of each rank's first {ccl} group terminates that process "
                          f"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC later unless that group was aborted (the hetero "
                          f"bridge aborts its device groups when one fails; abort groups you built yourself); "
                          f"unset it (the HAL then sets {name}=0) to keep the ranks that raised alive",
                          RuntimeWarning, stacklevel=3)


def nccl_group_class(chip: str = "cuda") -> Any:
    """The class torch's `_new_process_group_helper` constructs for backend `nccl`."""
    from torch.distributed import distributed_c10d as c10d
    pg_class = getattr(c10d, "ProcessGroupNCCL", None)
    if pg_class is None:  # distributed_c10d only imports it when torch was built with NCCL
        raise sdk.ChipUnavailableError(
            f"chip {chip!r}, hook 'hal_create_process_group': this torch build has no NCCL "
            f"(torch.distributed.distributed_c10d.ProcessGroupNCCL is missing); install a CUDA build of torch")
    return pg_class


def nccl_options(pg_class: Any, timeout: timedelta, global_ranks: Sequence[int], group_name: str) -> Any:
    """`pg_class.Options` filled as _new_process_group_helper fills them (torch 2.13)."""
    options = pg_class.Options()
    options.is_high_priority_stream = False
    options._timeout = timeout
    options.global_ranks_in_group = list(global_ranks)
    options.group_name = group_name
    return options


def create_nccl_process_group(store: Any, rank: int, world_size: int, timeout: timedelta,
                              global_ranks: Optional[Sequence[int]] = None, group_name: Optional[str] = None,
                              chip: str = "cuda") -> Any:
    """`ProcessGroupNCCL(store, rank, world_size, options)` with the HAL timeout, the group's global
    ranks and name, as distributed_c10d._new_process_group_helper builds it (torch 2.13)."""
    ranks, name = sdk.check_process_group_args(chip, rank, world_size, timeout, global_ranks, group_name)
    pg_class = nccl_group_class(chip)
    ensure_catchable_timeouts()
    pg = pg_class(store, rank, world_size, nccl_options(pg_class, timeout, ranks, name))
    seq = getattr(pg, "_set_sequence_number_for_group", None)
    if callable(seq):
        seq()  # as torch does right after creating an NCCL backend
    return pg
