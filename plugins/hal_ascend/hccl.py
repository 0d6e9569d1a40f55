"""HCCL as torch_npu's ProcessGroupHCCL really offers it: capability matrix, timeouts, group creation.

Sources (Ascend/pytorch master, commit 9e73e708, which builds torch_npu for torch 2.13-2.15):
- torch_npu/csrc/distributed/ProcessGroupHCCL.cpp: `hcclOp` maps MIN, MAX, SUM, PRODUCT; BAND, BOR,
  BXOR raise "Cannot use ReduceOp.BAND with HCCL"; AVG is a SUM followed by `tensor.div_(size)` on the
  PG's stream, which fails for integer tensors (true division into an int tensor), so AVG is declared
  for floating dtypes only; PREMUL_SUM multiplies first and accepts half, float, bfloat16, double;
  bool SUM becomes MAX. `checkSupportedDataType` limits the reductions to int8, int16, int32, int64,
  float16, float32, bfloat16 (uint64/float64 only on Ascend950); allreduce and reduce first cast bool
  and uint8 to int32 (so they reduce too), reduce_scatter does not. AllGather and Broadcast "support
  all data type", as do all_to_all, scatter and send/recv: every dtype in `kScalarTypeToHcclDataType`
  (HCCLUtils.cpp), float8 included -- *as far as torch_npu is concerned*.
- What HCCL itself accepts depends on the product (the SoC, `torch.npu.get_soc_version()`, values in
  torch_npu/csrc/core/npu/NpuVariables.h: 100-104 Atlas training series (910A/910 Pro), 220-225 Atlas
  A2 (910B1-B4), 250-256 Atlas A3 (910_93xx), 260 Ascend 950). CANN HCCL API references:
  hcclpython allreduce (CANN 8.0.RC2, hcclpython_07_0018): Atlas training series reduce int8, int32,
  int64, float16, float32 (no int16, no bfloat16); Atlas A2 adds int16 and bfp16 but "prod" supports
  neither int16 nor bfp16; HcclAllGather (CANN 8.0.alpha001, hcclcpp_07_0023): the training series
  moves int8..float64 without bfp16, A2 with bfp16; float8 (fp8-e4m3/e5m2) appears only in the Ascend
  950 tables (CANN/HCCL "Server间通信算法支持度列表", 950PR/950DT), whose AllReduce/Reduce/ReduceScatter
  list int8, int16, int32, float16, float32, bfp16 (no int64). A3 is declared like A2 (same rules in
  the HCCL_ALGO tables of CANN 8.1.RC1 envref_07_0079, which list A2 and A3 together). Where torch_npu
  and CANN differ we declare the intersection; undeclared means "emulated by the bridge", never
  "known broken". 310P/310B inference parts and unknown SoCs get the training-series matrix.
  Before a device is selected (plugin validation, emulated chips) the SoC is unknown and the matrix
  is the A2 one: the catalog's default Ascend is the 910B2.
- gather: HCCL has no gather primitive. torch_npu's `dist.gather` replaces it with all_gather
  (torch_npu/distributed/distributed_c10d.py `_gather`), so gather is *not* declared native.
- creation: torch_npu/_init/registry/distributed.py `_new_process_group_hccl_helper`:
  `ProcessGroupHCCL.Options()`, `is_high_priority_stream = False`, `_timeout = timeout`,
  `global_ranks_in_group = dist_backend_opts.global_ranks_in_group`, `group_id =
  dist_backend_opts.group_id` (torch's group name), then `ProcessGroupHCCL(store, rank, size, options)`.
  We pass the hook's `global_ranks` and `group_name` the same way: ProcessGroupHCCL.cpp derives the
  HCCL communicator id from `std::hash<string>{}(group_id)` and treats an empty
  `global_ranks_in_group` as the global group, so both must be the group's own and equal on every
  member (a per-process counter is not: processes in different groups count differently).

Timeouts (what a timeout does on HCCL). HCCL keeps two of its own, read from the environment:
HCCL_CONNECT_TIMEOUT (link setup; seconds in [120, 7200], default 120: CANN envref_07_0077) and
HCCL_EXEC_TIMEOUT (how long a device waits for its peers inside a collective; default 1836 s;
Atlas A2/A3 accept [0, 2^31-1] s, Atlas training products (0, 17340] and round *down* to a multiple of
68 s: CANN envref_07_0078). torch_npu expects HCCL to give up *before* the group's watchdog: with a
group timeout T <= HCCL_EXEC_TIMEOUT it warns "The watchdog timeout ... is less than or equal to HCCL
execution timeout ... The plog may not be recorded" (ProcessGroupHCCL.cpp, constructor), because
HCCL's device-side logs are written when HCCL times out. So we set, before the first group exists:
  HCCL_EXEC_TIMEOUT    = the largest multiple of 68 s below T (training series and unknown SoCs), or
                         ceil(T) - 1 s (A2/A3/950, which take any value); at least 1 s / 68 s
  HCCL_CONNECT_TIMEOUT = clamp(ceil(T), 120, 7200)
A T too small for that order (T <= 68 s on the training series) is warned about. torch_npu reads
HCCL_EXEC_TIMEOUT once per process (a `call_once` for the op-wait timeout and a function-static in
`WorkHCCL::checkExec`), so the first group fixes it; a later group with another T is warned about.
A collective that outlives T: HCCL fails it on the device, and ProcessGroupHCCL's watchdog (options
._timeout = T) marks the work failed. What happens next is torch_npu's error handling
(ProcessGroupHCCL.cpp / .hpp @9e73e708, OptionsManager.cpp `CheckUseHcclAsyncErrorHandleEnable`):
- TORCH_HCCL_ASYNC_ERROR_HANDLING (else HCCL_ASYNC_ERROR_HANDLING) is read once per process and
  defaults to 1, TearDown: the watchdog rethrows the timeout in its own thread (`handleException`,
  SHOULD_TEAR_DOWN) and the process dies; 2 (CleanUpOnly) leaves it alive.
- `WorkHCCL::wait(timeout)` blocks the host only when the group was built with
  TORCH_HCCL_BLOCKING_WAIT=1 (or the older HCCL_BLOCKING_WAIT=1; read by each group's constructor,
  the first name set wins); otherwise it only makes the current stream wait and returns at once,
  whatever the timeout. So the bridge's timed wait would return on an unfinished collective, and the
  watchdog would then tear the process down -- the opposite of the contract.
So before every HCCL group we set TORCH_HCCL_BLOCKING_WAIT=1 (`ensure_blocking_wait`; a different
value the user set is replaced, with a warning): `wait(timeout)` then blocks until the work completes
or the timeout passes, then aborts the work's HCCL communicators and raises the timeout in the
caller's thread (RuntimeError "... Watchdog caught collective operation timeout ..."), which the
bridge types (hal.ccl_bridge.ccl.Handle). With blocking wait the constructor switches that group's
error handling to NoHandling ("Only TORCH_HCCL_BLOCKING_WAIT is being used in this process"), so its
watchdog never tears the process down, whatever TORCH_HCCL_ASYNC_ERROR_HANDLING says. The price:
every `work.wait()` on these groups blocks the host until the collective is done (torch_npu's
documented meaning of blocking wait). torch_npu's heartbeat monitor and dump-on-timeout
(TORCH_HCCL_ENABLE_MONITORING, TORCH_HCCL_DUMP_ON_TIMEOUT) are off by default; turning both on lets
a timeout kill the process again, which we warn about.
"""
from __future__ import annotations

import math
import os
import warnings
from datetime import timedelta
from typing import Any, MutableMapping, Optional, Sequence

from hal import sdk

HCCL_EXEC_STEP_S = 68
HCCL_EXEC_MAX_S = 17340  # Atlas training products' maximum (= 255 x 68); A2/A3 allow more
HCCL_CONNECT_MIN_S, HCCL_CONNECT_MAX_S = 120, 7200

_CAST_TO_INT32 = ("bool", "uint8")  # allreduce / reduce only
_FLOAT_REDUCE = ("float16", "float32", "bfloat16")
_BASE_MOVE = ("uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "bool")
_FP8 = ("float8_e4m3fn", "float8_e5m2")
_NOT_NATIVE = ("gather",)

# Per product family: the dtypes HCCL reduces, those PRODUCT refuses, those it moves.
_FAMILIES = {
    "training": {"reduce": ("int8", "int32", "int64", "float16", "float32"), "no_product": (),
                 "move": _BASE_MOVE},
    "A2": {"reduce": ("int8", "int16", "int32", "int64", "float16", "float32", "bfloat16"),
           "no_product": ("int16", "bfloat16"), "move": _BASE_MOVE + ("bfloat16",)},
    "950": {"reduce": ("int8", "int16", "int32", "float16", "float32", "bfloat16"),
            "no_product": ("int16", "bfloat16"), "move": _BASE_MOVE + ("bfloat16",) + _FP8},
}
_FAMILIES["A3"] = _FAMILIES["A2"]

SOURCE = ("read from Ascend/pytorch@9e73e708 torch_npu/csrc/distributed/ProcessGroupHCCL.cpp (hcclOp, "
          "checkSupportedDataType), HCCLUtils.cpp (kScalarTypeToHcclDataType), "
          "torch_npu/distributed/distributed_c10d.py (_gather via all_gather), intersected with the CANN "
          "HCCL API references' per-product dtype lists")


def soc_family(soc_version: Optional[int]) -> str:
    """'A2', 'A3', '950', 'training' (Atlas training series, 310P/310B and unknown SoCs) or 'default'
    (None: no device selected yet -> the A2 matrix of the catalog's default 910B2)."""
    if soc_version is None:
        return "default"
    v = int(soc_version)
    if 220 <= v <= 225:
        return "A2"
    if 250 <= v <= 256:
        return "A3"
    if v >= 260:
        return "950"
    return "training"


def hccl_capabilities(chip: str = "ascend", soc_version: Optional[int] = None) -> sdk.CapabilityMatrix:
    family = soc_family(soc_version)
    rules = _FAMILIES["A2" if family == "default" else family]
    entries: set[tuple[str, str, str]] = set()
    for coll in sdk.COLLECTIVES:
        if coll in _NOT_NATIVE:
            continue
        if coll not in sdk.REDUCING:
            entries.update((coll, d, "-") for d in rules["move"])
            continue
        dtypes = rules["reduce"] + (_CAST_TO_INT32 if coll in ("all_reduce", "reduce") else ())
        for d in dtypes:
            ops = ["sum", "max", "min"] + ([] if d in rules["no_product"] else ["product"])
            if d in _FLOAT_REDUCE:
                ops += ["avg", "premul_sum"]
            entries.update((coll, d, op) for op in ops)
    soc = "SoC unknown (no device selected): A2 matrix" if soc_version is None else \
        f"SoC version {soc_version} ({family})"
    return sdk.CapabilityMatrix(chip=chip, entries=frozenset(entries), source=f"{SOURCE}; {soc}")


def hccl_timeout_env(timeout: timedelta, soc_version: Optional[int] = None) -> dict[str, str]:
    """The HCCL timeout variables for HAL timeout `timeout` (see the module docstring)."""
    secs = timeout.total_seconds()
    if secs <= 0:
        raise ValueError(f"HCCL timeouts: the HAL timeout must be positive, got {timeout!r}")
    below = math.ceil(secs) - 1  # HCCL must give up strictly before the group's watchdog
    if soc_family(soc_version) in ("A2", "A3", "950"):
        exec_s = max(1, below)
    else:
        exec_s = max(HCCL_EXEC_STEP_S, min(HCCL_EXEC_MAX_S, below // HCCL_EXEC_STEP_S * HCCL_EXEC_STEP_S))
    connect_s = min(HCCL_CONNECT_MAX_S, max(HCCL_CONNECT_MIN_S, math.ceil(secs)))
    return {"HCCL_EXEC_TIMEOUT": str(exec_s), "HCCL_CONNECT_TIMEOUT": str(connect_s)}


_applied: dict[str, str] = {}  # what this process first gave HCCL (torch_npu keeps it)


def apply_hccl_timeouts(timeout: timedelta, env: Optional[MutableMapping[str, str]] = None,
                        soc_version: Optional[int] = None) -> dict[str, str]:
    """Set the HCCL timeout variables for `timeout` in `env` (default os.environ), warning when a
    value the user set is replaced, when torch_npu will keep an earlier group's value, or when
    `timeout` is too short for HCCL to fail first."""
    env = os.environ if env is None else env
    want = hccl_timeout_env(timeout, soc_version)
    secs = timeout.total_seconds()
    if int(want["HCCL_EXEC_TIMEOUT"]) >= secs:
        warnings.warn(f"HAL timeout {secs:g} s is too short for HCCL to time out first: "
                      f"HCCL_EXEC_TIMEOUT cannot go below {want['HCCL_EXEC_TIMEOUT']} s on this product "
                      f"(SoC {soc_version}); torch_npu will say the plog may not be recorded",
                      RuntimeWarning, stacklevel=3)
    for name, value in want.items():
        old = env.get(name)
        if name in _applied and _applied[name] != value:
            warnings.warn(f"{name}: torch_npu read {_applied[name]} for this process's first HCCL group "
                          f"and keeps it; this group asked for {value}", RuntimeWarning, stacklevel=3)
            continue
        if old is not None and old != value and name not in _applied:
            warnings.warn(f"{name}={old} (set in the environment) replaced by {value}, derived from the "
                          f"HAL collective timeout {secs:g} s", RuntimeWarning, stacklevel=3)
        env[name] = value
        _applied.setdefault(name, value)
    return want


BLOCKING_WAIT_ENVS = ("TORCH_HCCL_BLOCKING_WAIT", "HCCL_BLOCKING_WAIT")  # ProcessGroupHCCL.hpp, first wins
_TRUE = ("1", "true", "y", "yes")  # c10d's getCvarBool


def ensure_blocking_wait(env: Optional[MutableMapping[str, str]] = None) -> None:
    """TORCH_HCCL_BLOCKING_WAIT=1 in `env` (default os.environ) before a group is built, so a timed
    wait blocks and raises instead of the watchdog tearing the process down (module docstring)."""
    env = os.environ if env is None else env
    torch_name, old_name = BLOCKING_WAIT_ENVS
    user = env.get(torch_name, env.get(old_name))
    if user is not None and user.strip().lower() not in _TRUE:
        set_as = torch_name if torch_name in env else old_name
        warnings.warn(f"{set_as}={user} (set in the environment) replaced by {torch_name}=1: without blocking "
                      f"wait torch_npu's work.wait(timeout) returns at once and its watchdog tears the process "
                      f"down on an HCCL timeout; the HAL promises an error the caller can catch",
                      RuntimeWarning, stacklevel=3)
    env[torch_name] = "1"
    monitors = [env.get(k, "").strip().lower() in _TRUE
                for k in ("TORCH_HCCL_ENABLE_MONITORING", "TORCH_HCCL_DUMP_ON_TIMEOUT")]
    if all(monitors):
        warnings.warn("TORCH_HCCL_ENABLE_MONITORING=1 and TORCH_HCCL_DUMP_ON_TIMEOUT=1 (set in the environment): "
                      "torch_npu's heartbeat monitor may terminate this process after an HCCL timeout that the "
                      "HAL reported as an error; unset one of them to keep the process alive",
                      RuntimeWarning, stacklevel=3)


def create_hccl_process_group(store: Any, rank: int, world_size: int, timeout: timedelta,
                              global_ranks: Optional[Sequence[int]] = None, group_name: Optional[str] = None,
                              chip: str = "ascend", soc_version: Optional[int] = None) -> Any:
    """torch_npu's ProcessGroupHCCL built as `_new_process_group_hccl_helper` builds it, with the
    group's global ranks and name, HCCL's own timeouts and blocking wait set first."""
    ranks, name = sdk.check_process_group_args(chip, rank, world_size, timeout, global_ranks, group_name)
    try:
        import torch_npu
        pg_class = torch_npu._C._distributed_c10d.ProcessGroupHCCL
    except (ImportError, AttributeError) as exc:
        raise sdk.ChipUnavailableError(f"chip {chip!r}, hook 'hal_create_process_group': torch_npu's "
                                       f"ProcessGroupHCCL is unavailable: {type(exc).__name__}: {exc}") from exc
    apply_hccl_timeouts(timeout, soc_version=soc_version)  # before the group: torch_npu reads them then
    ensure_blocking_wait()  # read by this group's constructor: timeouts raise in the waiting thread
    options = pg_class.Options()
    options.is_high_priority_stream = False
    options._timeout = timeout
    options.global_ranks_in_group = ranks
    options.group_id = name
    return pg_class(store, rank, world_size, options)
