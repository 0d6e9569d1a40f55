"""Stand-in for torch_npu._C._distributed_c10d.ProcessGroupHCCL and its Options.

Ascend/pytorch @ 9e73e708:
- Options (torch_npu/csrc/distributed/Init.cpp): a pybind class with op_timeout,
  is_high_priority_stream, global_ranks_in_group, hccl_config, group_id, plus the base options'
  `_timeout`; assigning any other attribute raises AttributeError (e.g. `group_name`, NCCL's name).
- Constructed as torch_npu/_init/registry/distributed.py `_new_process_group_hccl_helper` does:
  `ProcessGroupHCCL(store, group_rank, group_size, options)` with `group_id` = torch's group name and
  `global_ranks_in_group` = the group's global ranks.
- ProcessGroupHCCL.cpp: the group is named "group_name_" + group_id; an empty
  `global_ranks_in_group` makes it the global (default) group; the HCCL communicator id is
  `std::hash<string>{}(group_id)`. HCCL_EXEC_TIMEOUT (default 1836 s) is read for the op-wait timeout
  under a `call_once` and in `WorkHCCL::checkExec` as a function-static, so the first group fixes
  it for the process; with error handling TearDown (TORCH_HCCL_ASYNC_ERROR_HANDLING's default) and a non-default
  group timeout <= HCCL_EXEC_TIMEOUT x 1000 ms the constructor warns "The watchdog timeout ...ms(which
  is set by init_process_group) is less than or equal to HCCL execution timeout ...ms! The plog may
  not be recorded." (HCCL must fail first, on the device, for its logs to be kept.)
- Error handling (ProcessGroupHCCL.cpp / .hpp, torch_npu/csrc/core/npu/register/OptionsManager.cpp):
  TORCH_HCCL_ASYNC_ERROR_HANDLING (else the deprecated HCCL_ASYNC_ERROR_HANDLING) is read once per
  process (`CheckUseHcclAsyncErrorHandleEnable`, a function-static) and defaults to 1, TearDown.
  TORCH_HCCL_BLOCKING_WAIT (else HCCL_BLOCKING_WAIT; the first one set wins, c10d's getCvarBool) is
  read by every group's constructor, default false; when it is on the group's error handling becomes
  NoHandling ("Only TORCH_HCCL_BLOCKING_WAIT is being used in this process").
  `WorkHCCL::wait(timeout)` = `synchronizeInternal`: it blocks the host *only with blocking wait*
  (until the work completes or `timeout`, else the op timeout, passes; then it aborts the work's
  communicators and rethrows "[Rank r] Watchdog caught collective operation timeout: ... ran for N
  milliseconds before timing out." as a RuntimeError); without it, it only makes the current stream
  wait and returns at once, whatever `timeout` says. The watchdog, once a work outlives
  `options._timeout`, calls `handleException(asyncErrorHandling_)`, which rethrows in the watchdog
  thread -- the process is torn down -- for TearDown (1) and SkipCleanUp (3) (SHOULD_TEAR_DOWN).
  Here a teardown is recorded in `STATE.teardowns` instead. TORCH_HCCL_ENABLE_MONITORING and
  TORCH_HCCL_DUMP_ON_TIMEOUT default to false in torch_npu, so no heartbeat monitor is modelled.
  Collectives run on the NCCL stand-in's fake engine (`_stand_in_nccl.FakeCollectiveGroup`).
The record includes the HCCL_* variables as they were when the group was built.
"""
from __future__ import annotations

import os
import warnings
from datetime import timedelta

from _fixed import FixedFields  # top-level: the stand-ins folder is on sys.path
from _stand_in_nccl import FakeCollectiveGroup, FakeWork, cvar, cvar_bool

from .._state import STATE

DEFAULT_EXEC_TIMEOUT_S = 1836
DEFAULT_TIMEOUT = timedelta(minutes=30)


TEAR_DOWN, NO_HANDLING = 1, 0


def _async_error_handling() -> int:
    """CheckUseHcclAsyncErrorHandleEnable: read once per process, default 1 (TearDown)."""
    if STATE.async_error_handling_first_read is None:
        value = int(cvar(("TORCH_HCCL_ASYNC_ERROR_HANDLING", "HCCL_ASYNC_ERROR_HANDLING"), str(TEAR_DOWN)))
        if value not in (0, 1, 2, 3):
            raise RuntimeError("TORCH_HCCL_ASYNC_ERROR_HANDLING should be 0, 1, 2, or 3.")
        STATE.async_error_handling_first_read = value
    return STATE.async_error_handling_first_read


class ProcessGroupHCCL(FakeCollectiveGroup):
    class Options(FixedFields):
        _FIELDS = ("_timeout", "op_timeout", "is_high_priority_stream", "global_ranks_in_group", "hccl_config",
                   "group_id")
        _READ_ONLY = ("backend",)

        def __init__(self) -> None:
            self._init(backend="hccl", _timeout=DEFAULT_TIMEOUT, op_timeout=DEFAULT_TIMEOUT,
                       is_high_priority_stream=False, global_ranks_in_group=[], hccl_config={}, group_id="")

    def __init__(self, store, rank: int, size: int, options: "ProcessGroupHCCL.Options"):
        if not isinstance(options, ProcessGroupHCCL.Options):
            raise TypeError(f"__init__(): incompatible constructor arguments: options must be "
                            f"ProcessGroupHCCL.Options, got {type(options).__name__}")
        env = {k: os.environ.get(k) for k in ("HCCL_EXEC_TIMEOUT", "HCCL_CONNECT_TIMEOUT")}
        self.blocking_wait = cvar_bool(("TORCH_HCCL_BLOCKING_WAIT", "HCCL_BLOCKING_WAIT"), False)
        self.async_error_handling = NO_HANDLING if self.blocking_wait else _async_error_handling()
        exec_s = int(env["HCCL_EXEC_TIMEOUT"]) if env["HCCL_EXEC_TIMEOUT"] is not None else -1
        if STATE.exec_timeout_first_read is None:
            STATE.exec_timeout_first_read = exec_s if exec_s >= 0 else DEFAULT_EXEC_TIMEOUT_S
        exec_s = DEFAULT_EXEC_TIMEOUT_S if exec_s < 0 else exec_s
        timeout_ms = int(options._timeout.total_seconds() * 1000)
        tear_down = self.async_error_handling == TEAR_DOWN  # the warning sits under `if (asyncErrorHandling_ == TearDown)`
        if tear_down and options._timeout != DEFAULT_TIMEOUT and timeout_ms <= exec_s * 1000:
            warnings.warn(f"The watchdog timeout {timeout_ms}ms(which is set by init_process_group) is less than "
                          f"or equal to HCCL execution timeout {exec_s * 1000}ms! The plog may not be recorded.",
                          UserWarning, stacklevel=2)
        STATE.record.record("ProcessGroupHCCL", rank, size, timeout_s=options._timeout.total_seconds(),
                            is_high_priority_stream=options.is_high_priority_stream,
                            group_id=options.group_id, global_ranks_in_group=list(options.global_ranks_in_group),
                            env=env, store=type(store).__name__, current_device=STATE.current,
                            blocking_wait=self.blocking_wait, async_error_handling=self.async_error_handling)
        self._start(store, rank, size, options, options.group_id)
        self.is_global = not options.global_ranks_in_group
        self.group_name = "group_name_" + options.group_id
        self.hccl_comm_id = hash(options.group_id)

    def getBackendName(self) -> str:
        return "hccl"

    # ---- WorkHCCL::wait and the watchdog (see the module docstring) ----------------------------
    def _host_waits(self, timeout) -> bool:
        return self.blocking_wait  # without blocking wait, wait(timeout) only orders streams

    def _blocking_timeout_error(self, work: FakeWork, limit_s: float) -> BaseException:
        return RuntimeError(f"[Rank {self._rank}] Watchdog caught collective operation timeout: "
                            f"WorkHCCL(SeqNum={work.seq}) ran for {int(limit_s * 1000)} milliseconds "
                            f"before timing out.")

    def _on_watchdog_timeout(self, work: FakeWork) -> None:
        if self.async_error_handling in (1, 3):  # SHOULD_TEAR_DOWN: rethrown in the watchdog thread
            self._teardown(f"rank {self._rank} seq {work.seq}: HCCL watchdog timeout with "
                           f"TORCH_HCCL_ASYNC_ERROR_HANDLING={self.async_error_handling}: process torn down")

    def _teardown(self, why: str) -> None:
        STATE.teardowns.append(why)
