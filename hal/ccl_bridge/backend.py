"""The `hetero` backend's creator and its registration with torch.distributed.

`create()` runs on every member of a new `hetero` group (`init_process_group("hetero")` or
`new_group(..., backend="hetero")`), inside torch's group construction, where no default group exists
yet: everything is built straight from the creator's store.

1. Each rank publishes its chip identity (`hal.accelerator()`: chip, emulated flag, torch device
   type, CCL backend, host) and the bridge settings under `hetero/identity/<rank>`, then reads all.
   Settings that differ between ranks raise `BridgeConfigError` naming each rank's values.
2. One chip kind only: the chip's own group is returned (pass-through to the vendor backend, or
   the CPU fabric for an emulated chip); torch registers it for the group like any backend.
3. Otherwise the fabric is built (global gloo, the sub-cluster's CCL, the rails; see `fabric`) and a
   `HeteroProcessGroup` returned.
"""
from __future__ import annotations

import json
import socket
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore

import hal
from hal.contract.compat import register_backend
from hal.emulation.gloo_fallback import native_capabilities

from .ccl import Ccl
from .config import BridgeConfig
from .duplex import back_group
from .errors import BridgeConfigError
from .fabric import CPU, Fabric
from .process_group import HeteroProcessGroup
from .staging import DeviceSync, ScratchPool
from .topology import RankIdentity, Topology, build_topology

BACKEND = "hetero"
# Device types a hetero group may see tensors on: the host (emulated chips) and the vendors' types.
# A vendor type torch does not know yet (npu before torch_npu renames PrivateUse1) is covered by
# "privateuseone", which is the same device type once renamed.
BASE_DEVICES = ("cpu", "cuda", "xpu", "privateuseone")


def local_identity() -> RankIdentity:
    acc = hal.accelerator()
    return RankIdentity(chip=acc.chip.name, emulated=acc.emulated, device_type=acc.device.type,
                        host=socket.gethostname(), ccl_backend=acc.chip.ccl_backend)


def exchange_identities(store, rank: int, size: int, config: BridgeConfig) -> list[RankIdentity]:
    mine = dict(local_identity().to_dict(), config=config.agreement_key())
    store.set(f"hetero/identity/{rank}", json.dumps(mine))
    raw = [json.loads(store.get(f"hetero/identity/{r}")) for r in range(size)]
    configs = [r.pop("config") for r in raw]
    if any(c != configs[0] for c in configs):
        listing = "; ".join(f"rank {r}: {c}" for r, c in enumerate(configs))
        raise BridgeConfigError(f"hetero: bridge settings differ between ranks (they choose algorithms and "
                                f"must agree; check HAL_BRIDGE_* on every node): {listing}")
    return [RankIdentity.from_dict(r) for r in raw]


def block_all_to_all(identities: list[RankIdentity], config: BridgeConfig) -> bool:
    """Whether the rail all_to_all goes one message per block (`duplex.send_blocks`) rather than one packed
    message per peer: only when every rank's tensors are host tensors (no rank stages through pinned host
    memory). A group-wide decision from the exchanged identities, so every member of a rail speaks the same
    protocol: a per-rank choice left a native CUDA rank (packed, tag 0) and host ranks (per block, tag =
    source) waiting on each other's sends until the bridge's timeout (tests/test_native_lane.py on an H100)."""
    return not config.force_staging and all(ident.device_type == "cpu" for ident in identities)


def build_fabric(store, rank: int, size: int, timeout: timedelta, topo: Topology, config: BridgeConfig,
                 global_ranks: Optional[list[int]] = None, group_id: str = "", block_a2a: bool = False) -> Fabric:
    acc = hal.accelerator()
    gloo_caps = native_capabilities()  # raw gloo groups below: what this torch's gloo does (2.5: less)
    inner: list[Any] = []
    granks = global_ranks or list(range(size))

    g = dist.ProcessGroupGloo(PrefixStore("hetero/global", store), rank, size, timeout)
    inner.append(g)
    glob = Ccl(g, gloo_caps, f"global gloo group (ranks {granks})", rank, size, CPU, timeout)

    c = topo.cluster_of[rank]
    sc = topo.subclusters[c]
    idx = topo.index_in_cluster[rank]
    members = [granks[r] for r in sc.ranks]
    intra_pg = None
    if sc.size > 1:
        # contract 1.1: the vendor group gets its members' global ranks and a name shared by every
        # member (torch's group id of the hetero group + the sub-cluster), as NCCL/HCCL need
        intra_pg = acc.new_process_group(PrefixStore(f"hetero/intra/{c}", store), idx, sc.size, timeout,
                                         global_ranks=members,
                                         group_name=f"{group_id}/intra/{c}" if group_id else None)
        inner.append(intra_pg)
    kind = "emulated " if sc.emulated else ""
    intra = Ccl(intra_pg, acc.capabilities, f"{kind}{sc.chip} sub-cluster CCL (ranks {members})", idx, sc.size,
                acc.device, timeout)

    rails: dict[int, Ccl] = {}
    rails_back: dict[int, Ccl] = {}
    for rail in topo.rails:
        if rank not in rail.members:
            continue
        pos = rail.members.index(rank)
        pg = dist.ProcessGroupGloo(PrefixStore(f"hetero/rail/{rail.index}", store), pos, len(rail.members), timeout)
        inner.append(pg)
        rails[rail.index] = Ccl(pg, gloo_caps, f"rail {rail.index} gloo group (ranks "
                                f"{[granks[r] for r in rail.members]})", pos, len(rail.members), CPU, timeout)
        if topo.rail_mode:   # the all_to_all rail step's second direction (hal.ccl_bridge.duplex)
            rails_back[rail.index] = back_group(store, rail, pos, timeout, granks, gloo_caps, inner)
    native = not acc.emulated and acc.device.type != "cpu"
    scratch = ScratchPool(pin=acc.pin_memory if native else None)
    if native:  # pinned host staging, allocated once: a chunk's shard per pipeline slot (see allreduce)
        for slot in range(config.pipeline_depth):
            scratch.reserve(("host", ("rail", slot)), config.chunk_bytes // sc.size + 64 * topo.parts, CPU)
        scratch.reserve(("host", "leader"), config.small_bytes, CPU)
    return Fabric(topo=topo, rank=rank, config=config, timeout=timeout, intra=intra, glob=glob, rails=rails,
                  scratch=scratch, sync=DeviceSync(acc), global_ranks=granks, inner_groups=inner,
                  rails_back=rails_back, block_a2a=block_a2a)


def create(dist_opts, pg_options=None):
    """torch's extended-API creator: (DistributedBackendOptions, pg_options) -> group or backend."""
    store, rank, size = dist_opts.store, dist_opts.group_rank, dist_opts.group_size
    timeout = dist_opts.timeout
    global_ranks = list(dist_opts.global_ranks_in_group) or None
    group_id = getattr(dist_opts, "group_id", "") or ""   # torch 2.13: the group's name (distributed_c10d.py)
    if pg_options is not None and not isinstance(pg_options, BridgeConfig):
        raise BridgeConfigError(f"hetero: pg_options must be a hal.ccl_bridge.BridgeConfig, "
                                f"got {type(pg_options).__name__}")
    config = pg_options or BridgeConfig.from_env()
    identities = exchange_identities(store, rank, size, config)
    topo = build_topology(identities, config.max_parts)
    if topo.single_chip:
        return hal.accelerator().new_process_group(PrefixStore("hetero/passthrough", store), rank, size, timeout,
                                                   global_ranks=global_ranks or list(range(size)),
                                                   group_name=f"{group_id}/passthrough" if group_id else None)
    return HeteroProcessGroup(build_fabric(store, rank, size, timeout, topo, config, global_ranks, group_id,
                                           block_all_to_all(identities, config)))


def _valid(device_type: str) -> bool:
    try:
        torch.device(device_type)
        return True
    except RuntimeError:
        return False


def _known_device_types() -> set[str]:
    """Device types torch accepts in this process (a pass-through group registers its backend for
    each of them, and torch refuses a name it does not know)."""
    out = set(BASE_DEVICES)
    try:
        pm = hal.get_plugin_manager()
        out |= {spec.torch_device_type for spec, _ in pm.chips.values()}
    except Exception:  # a broken plugin is reported when the accelerator binds, not at import
        pass
    return {d for d in out if _valid(d)}


def register() -> None:
    """Register `hetero` with torch.distributed (idempotent: a second call re-registers the same
    creator). Devices are declared so torch accepts the group for them, but `hetero` does not become
    the default backend of any device type (the map is restored for types it would newly claim)."""
    devices = sorted(_known_device_types())
    before = dict(dist.Backend.default_device_backend_map)
    register_backend(BACKEND, create, extended_api=True, devices=devices)  # torch 2.5 asserts on a second one
    for d in devices:
        if d not in before:
            dist.Backend.default_device_backend_map.pop(d, None)
