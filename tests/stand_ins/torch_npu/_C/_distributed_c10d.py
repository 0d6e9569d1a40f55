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
  it for the process; with TORCH_HCCL_ASYNC_ERROR_HANDLING's default (TearDown) and a non-default
  group timeout <= HCCL_EXEC_TIMEOUT x 1000 ms the constructor warns "The watchdog timeout ...ms(which
  is set by init_process_group) is less than or equal to HCCL execution timeout ...ms! The plog may
  not be recorded." (HCCL must fail first, on the device, for its logs to be kept.)
The record includes the HCCL_* variables as they were when the group was built.
"""
from __future__ import annotations

import os
import warnings
from datetime import timedelta

from _fixed import FixedFields  # top-level: the stand-ins folder is on sys.path

from .._state import STATE

DEFAULT_EXEC_TIMEOUT_S = 1836
DEFAULT_TIMEOUT = timedelta(minutes=30)


class ProcessGroupHCCL:
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
        exec_s = int(env["HCCL_EXEC_TIMEOUT"]) if env["HCCL_EXEC_TIMEOUT"] is not None else -1
        if STATE.exec_timeout_first_read is None:
            STATE.exec_timeout_first_read = exec_s if exec_s >= 0 else DEFAULT_EXEC_TIMEOUT_S
        exec_s = DEFAULT_EXEC_TIMEOUT_S if exec_s < 0 else exec_s
        timeout_ms = int(options._timeout.total_seconds() * 1000)
        if options._timeout != DEFAULT_TIMEOUT and timeout_ms <= exec_s * 1000:
            warnings.warn(f"The watchdog timeout {timeout_ms}ms(which is set by init_process_group) is less than "
                          f"or equal to HCCL execution timeout {exec_s * 1000}ms! The plog may not be recorded.",
                          UserWarning, stacklevel=2)
        STATE.record.record("ProcessGroupHCCL", rank, size, timeout_s=options._timeout.total_seconds(),
                            is_high_priority_stream=options.is_high_priority_stream,
                            group_id=options.group_id, global_ranks_in_group=list(options.global_ranks_in_group),
                            env=env, store=type(store).__name__, current_device=STATE.current)
        self._rank, self._size, self.options = rank, size, options
        self.is_global = not options.global_ranks_in_group
        self.group_name = "group_name_" + options.group_id
        self.hccl_comm_id = hash(options.group_id)

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def getBackendName(self) -> str:
        return "hccl"
