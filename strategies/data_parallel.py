"""Data parallelism: torch's own DistributedDataParallel on any process group (`hetero` included).

A thin wrapper, on purpose: the point of the bridge is that DDP runs on it unchanged. Smaller buckets
than DDP's 25 MB default let the first gradient all_reduce start (and cross the bridge) while backward
is still running; the caller picks the size.
"""
from __future__ import annotations

from typing import Optional

import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def wrap_ddp(model: nn.Module, group: Optional[dist.ProcessGroup] = None,
             bucket_cap_mb: float = 25.0) -> DistributedDataParallel:
    """DDP over `group` (default: the world). Parameters are broadcast from the group's first rank."""
    return DistributedDataParallel(model, process_group=group, bucket_cap_mb=bucket_cap_mb)
