"""ccl_bridge: the `hetero` torch.distributed backend that links sub-clusters of different chips.

    import hal.ccl_bridge                              # registers "hetero" (idempotent, safe to re-import)
    dist.init_process_group("hetero", timeout=timedelta(minutes=10))
    sub = dist.new_group([0, 2, 3], backend="hetero")

How it works (full reference: docs/bridge.md; each module's docstring has its part):
- `backend`: at creation every rank publishes its chip identity through the store; ranks with the
  same chip and emulated flag form a sub-cluster. One chip kind: the chip's own group is returned
  (pass-through). Otherwise: the sub-cluster's CCL from `hal.accelerator().new_process_group`
  (the vendor group natively, the CPU fabric for an emulated chip), a gloo group per rail and one
  global gloo group, all with the group's timeout.
- `topology`: rails and homes, from `hal.core.topology` (their one definition). A message is cut into
  lcm(sub-cluster sizes) parts; index i of a sub-cluster is home of its share of parts, and each
  part's homes form its rail, so uneven shapes (3+1, 2+1+1) have a defined home for every part and
  every rank forwards only its share.
- `allreduce`: large messages take the rail path (intra reduce-scatter -> pinned host staging ->
  rail all_reduce on gloo -> intra all_gather), chunked and pipelined with bounded depth; small ones
  a single leader per sub-cluster; optional bfloat16 wire with float32 accumulation.
- `collectives`: reduce-scatter and all-gather along rails, broadcast through a rail, gather /
  scatter / cross-sub-cluster send-recv over the global gloo group.
- `alltoall`: all_to_all(_single) over rails: intra hand-off to the relay on the destination's
  rail, one rail hop to the destination, uneven splits exact.
- `ccl`: each inner group with its capability matrix; what a CCL lacks is emulated (bit carriers,
  widening, building one collective from another, gather-then-reduce) or refused with
  `hal.NotSupportedError` -- never silently wrong.
- `process_group` / `work`: the `dist.ProcessGroup` subclass torch, DDP and FSDP2 call, an executor
  thread per group (calls run in order, work objects return at once), typed errors
  (`BridgeTimeoutError`, `BridgePeerError`) naming op, sequence number and stage within timeout +
  grace, and the `HAL_BRIDGE_DEBUG=1` agreement check (`debug`).

Emulated chips run on CPU tensors; only their identity, profile and capability matrix are the real
chip's, and every report says "emulated". Tolerances for float reductions (the bridge adds in a
different order than flat gloo): SUM within W * eps * sum_r |x_r| of the exact result, AVG that / W
plus one rounding, PRODUCT W * eps * |exact|, MAX/MIN and integers exact; the bf16 wire adds
k * 2^-9 * sum_r |x_r|. Switches (`HAL_BRIDGE_SMALL_BYTES`, `_CHUNK_BYTES`, `_PIPELINE_DEPTH`,
`_WIRE_DTYPE`, `_DEBUG`, `_GRACE_S`, `_MAX_PARTS`, `_FORCE_STAGING`): `config`.
"""
from .backend import create, local_identity, register
from .config import BridgeConfig
from .errors import (BridgeCollectiveError, BridgeConfigError, BridgeError, BridgeMismatchError,
                     BridgePeerError, BridgeTimeoutError)
from .process_group import HeteroProcessGroup
from .topology import RankIdentity, Topology, build_topology

register()

__all__ = ["BridgeConfig", "BridgeCollectiveError", "BridgeConfigError", "BridgeError", "BridgeMismatchError",
           "BridgePeerError", "BridgeTimeoutError", "HeteroProcessGroup", "RankIdentity", "Topology",
           "build_topology", "create", "local_identity", "register"]
