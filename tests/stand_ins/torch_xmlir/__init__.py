"""Stand-in for KunlunXin's torch_xmlir: importable means "KunlunXin's PyTorch build", which is how
baidu-baige/sglang-kunlun (sglang_kunlun/platform/srt.py `activate`) recognises a Kunlun machine.

What hal_kunlun touches: `__version__`, `xpu.get_device_name(index)` (torch_xmlir/xpu/device.py as a
public analysis of the package describes it: a thin wrapper over
`_XMLIRC._xpu_get_device_properties(d).name`), and what the import does to torch.distributed. The
real package is closed source (not in the indexed sources); per the read recorded in issue 13 its
import swaps torch's `ProcessGroupNCCL` (the class `distributed_c10d._new_process_group_helper`
constructs for backend `nccl`) for its own XCCL-backed class and registers its own backend creator
for `nccl`. This stand-in does both, so a plugin that constructs `torch.distributed.ProcessGroupNCCL`
(the name exported when torch.distributed was imported) gets the wrong class, as it would on the real
build. `_undo()` restores torch (tests import this in-process; `stand_ins.deactivate()` calls it).
Tests set `xpu.NAMES` and read `xpu.CALLS` and `CREATED`.
"""
import torch.distributed as dist
import torch.distributed.distributed_c10d as _c10d

from _stand_in_nccl import FakeProcessGroupNCCL  # top-level: the stand-ins folder is on sys.path
from hal.contract.compat import register_backend

from . import xpu  # noqa: F401

__version__ = "stand-in"
CREATED: list[dict] = []  # (how the group was built, its options) per XCCL group


class XmlirProcessGroupNCCL(FakeProcessGroupNCCL):
    """torch_xmlir's XCCL-backed replacement for ProcessGroupNCCL (same constructor and Options)."""

    def __init__(self, store, rank, size, options):
        super().__init__(store, rank, size, options)
        self.record["class"] = "XmlirProcessGroupNCCL"


def _create(dist_opts, pg_options=None):
    """The backend creator, extended API (as `_new_process_group_helper` calls a registered one)."""
    if not isinstance(dist_opts, dist.distributed_c10d._DistributedBackendOptions):
        raise TypeError(f"expected _DistributedBackendOptions, got {type(dist_opts).__name__}")
    opts = pg_options if isinstance(pg_options, XmlirProcessGroupNCCL.Options) else XmlirProcessGroupNCCL.Options()
    opts._timeout = dist_opts.timeout
    opts.global_ranks_in_group = list(dist_opts.global_ranks_in_group)
    opts.group_name = dist_opts.group_id
    pg = XmlirProcessGroupNCCL(dist_opts.store, dist_opts.group_rank, dist_opts.group_size, opts)
    CREATED.append({"via": "creator", "group_name": opts.group_name, "timeout": opts._timeout})
    return pg


_SAVED = {"class": getattr(_c10d, "ProcessGroupNCCL", None), "plugin": dist.Backend._plugins.get("NCCL"),
          "type": dist.Backend.backend_type_map.get("nccl"),
          "devmap": dict(dist.Backend.default_device_backend_map),
          "capability": list(dist.Backend.backend_capability.get("nccl", []))}
_c10d.ProcessGroupNCCL = XmlirProcessGroupNCCL
# torch 2.5 (what the Kunlun stack ships) asserts on registering `nccl`, a name it builds in; how the
# closed-source package gets past that is not known, so the stand-in registers as 2.13 does on any torch
register_backend("nccl", _create, extended_api=True, devices=["cuda"])


def _undo() -> None:
    if _SAVED["class"] is None:
        _c10d.__dict__.pop("ProcessGroupNCCL", None)
    else:
        _c10d.ProcessGroupNCCL = _SAVED["class"]
    if _SAVED["plugin"] is None:
        dist.Backend._plugins.pop("NCCL", None)
    else:
        dist.Backend._plugins["NCCL"] = _SAVED["plugin"]
    dist.Backend.backend_type_map["nccl"] = _SAVED["type"]
    dist.Backend.default_device_backend_map.clear()
    dist.Backend.default_device_backend_map.update(_SAVED["devmap"])
    dist.Backend.backend_capability["nccl"] = _SAVED["capability"]
