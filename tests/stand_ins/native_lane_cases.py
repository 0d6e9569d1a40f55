"""The native lane's cases, run on every rank of a WorkerPool (tests/test_native_lane.py).

Two halves:
- `standin_*`: everywhere (CI). The bridge's native-chip path -- pinned host staging slots reserved at
  group creation, device->host copies into them, `DeviceSync` recording an event on the rank's current
  stream and synchronising it before gloo reads host memory, the caller's event waited by the executor,
  the executor threads binding the rank's device -- runs against the stand-in Stream/Event/pin of
  `_stand_in_streams` (no device exists here). Tensors stay CPU tensors (emulated chips with
  HAL_BRIDGE_FORCE_STAGING=1, which sends them through host staging as for a device); only the
  synchronisation and pinning objects are stand-ins, swapped into the fabric the bridge built.
- `gpu_*`: where a GPU exists (marker `native`). One native CUDA rank plus cpu ranks in one
  `hetero` group, through a collective matrix and DDP parity; nothing is a stand-in there.
"""
from __future__ import annotations

import datetime
import os
import threading
from typing import Any

import torch
import torch.distributed as dist

from . import activate

STANDIN: dict = {}


class StandInNativeChip:
    """What DeviceSync and ScratchPool use of an accelerator, on the stand-in device model: a native
    (not emulated) chip with `count` devices, this rank's being LOCAL_RANK % count."""

    def __init__(self, count: int = 2):
        activate()
        from _stand_in_streams import DeviceModel
        self.model = DeviceModel(count)
        self.emulated = False
        self.index = int(os.environ.get("LOCAL_RANK", "0")) % count
        self.device = torch.device("cpu")  # tensors stay on the host; only sync objects are stand-ins
        self.Event, self.Stream = self.model.Event, self.model.Stream
        self.pinned: set[int] = set()
        self.model.set_current(self.index)  # what the accelerator does at bind (main thread)

    def current_device_index(self) -> int:
        return self.model.current

    def set_device_index(self, index: int) -> None:
        self.model.set_current(index)

    def current_stream(self) -> Any:
        return self.model.current_stream()

    def pin_memory(self, t: torch.Tensor) -> torch.Tensor:
        pinned = t.clone()  # a new (page-locked, on a real chip) copy, as Tensor.pin_memory returns
        self.pinned.add(pinned.data_ptr())
        return pinned


def standin_setup(timeout_s: float = 60.0) -> dict:
    """Join `hetero` with the fabric's staging and sync swapped for stand-in native ones."""
    from hal.ccl_bridge import backend
    from hal.ccl_bridge.staging import DeviceSync, ScratchPool
    chip = StandInNativeChip()
    STANDIN["chip"] = chip
    built = backend.build_fabric

    def build_fabric(store, rank, size, timeout, topo, config, global_ranks=None, group_id="", block_a2a=False):
        fx = built(store, rank, size, timeout, topo, config, global_ranks, group_id, block_a2a)
        # As build_fabric does for a native chip (hal/ccl_bridge/backend.py): pinned host slots, reserved
        # now; a DeviceSync on the chip's streams.
        fx.scratch = ScratchPool(pin=chip.pin_memory)
        sc = topo.subclusters[topo.cluster_of[rank]]
        for slot in range(config.pipeline_depth):
            fx.scratch.reserve(("host", ("rail", slot)), config.chunk_bytes // sc.size + 64 * topo.parts,
                               torch.device("cpu"))
        fx.scratch.reserve(("host", "leader"), config.small_bytes, torch.device("cpu"))
        fx.sync = DeviceSync(chip, native=True)
        STANDIN["fabric"] = fx
        return fx

    backend.build_fabric = build_fabric
    try:
        if not dist.is_initialized():
            dist.init_process_group("hetero", timeout=datetime.timedelta(seconds=timeout_s))
    finally:
        backend.build_fabric = built
    pg = dist.group.WORLD
    return {"type": type(pg).__name__, "native_sync": STANDIN["fabric"].sync.native,
            "device_index": chip.index, "force_staging": STANDIN["fabric"].config.force_staging,
            "allocations_after_setup": STANDIN["fabric"].scratch.allocations}


def standin_collectives(n: int = 70_000) -> dict:
    """A few collectives on the world group; what the stand-in device saw."""
    chip, fx = STANDIN["chip"], STANDIN["fabric"]
    chip.model.log.clear()
    me, world = dist.get_rank(), dist.get_world_size()
    failures = []
    before = fx.scratch.allocations
    for rep in range(3):
        for dtype in (torch.float32, torch.bfloat16, torch.int64):
            t = torch.full((n,), me + 1, dtype=dtype)
            dist.all_reduce(t)
            want = world * (world + 1) // 2
            if not bool((t == want).all()):
                failures.append(f"all_reduce {dtype} rep {rep}: got {t[:3].tolist()}, want {want}")
        out = torch.empty(world * 1000, dtype=torch.float32)
        dist.all_gather_into_tensor(out, torch.full((1000,), float(me)))
        if not torch.equal(out, torch.arange(world, dtype=torch.float32).repeat_interleave(1000)):
            failures.append(f"all_gather rep {rep}")
        b = torch.full((5000,), float(me))
        dist.broadcast(b, src=world - 1)
        if not bool((b == world - 1).all()):
            failures.append(f"broadcast rep {rep}")
        if rep == 0:
            warm = fx.scratch.allocations
    main = threading.main_thread().name
    log = list(chip.model.log)
    executor = [entry for entry in log if entry[0] != main]
    host_slots = {k: v for k, v in fx.scratch._bufs.items() if k[0][0] == "host"}
    return {"failures": failures,
            "executor_records": sum(1 for e in executor if e[1] == "Event.record"),
            "executor_syncs": sum(1 for e in executor if e[1] == "Event.synchronize"),
            "executor_devices": sorted({e[2] for e in executor if e[1] == "Event.record"}),
            "caller_records": sum(1 for e in log if e[0] == main and e[1] == "Event.record"),
            "device_index": chip.index,
            "host_slots": len(host_slots),
            "unpinned_host_slots": [str(k) for k, v in host_slots.items() if v.data_ptr() not in chip.pinned],
            "allocations": (before, warm, fx.scratch.allocations)}


def standin_ddp() -> dict:
    """DDP parity on the stand-in native path (the strategy tests' model and reference)."""
    from tests import _strategy_cases
    return _strategy_cases.train_ddp()


# ---- where a GPU exists -------------------------------------------------------------------------
def gpu_setup(timeout_s: float = 120.0) -> dict:
    import hal
    import hal.ccl_bridge  # noqa: F401 - registers "hetero"
    if not dist.is_initialized():
        dist.init_process_group("hetero", timeout=datetime.timedelta(seconds=timeout_s))
    acc = hal.accelerator()
    return {"rank": dist.get_rank(), "chip": acc.chip.name, "emulated": acc.emulated, "device": str(acc.device),
            "group": type(dist.group.WORLD).__name__}


def gpu_matrix(sizes: tuple = (1000, 300_000)) -> dict:
    """all_reduce (sum/avg/max), all_gather, reduce_scatter, broadcast, all_to_all_single on the
    rank's own device (cuda on the native rank, cpu elsewhere), checked against exact expectations."""
    import hal
    dev = hal.accelerator().device
    me, world = dist.get_rank(), dist.get_world_size()
    failures, checks = [], 0

    def check(name, got, want):
        nonlocal checks
        checks += 1
        if not torch.equal(got.cpu(), want.cpu()):
            failures.append(f"{name}: got {got.reshape(-1)[:4].tolist()} want {want.reshape(-1)[:4].tolist()}")

    for n in sizes:
        for dtype in (torch.float32, torch.bfloat16, torch.int64):
            t = torch.full((n,), me + 1, dtype=dtype, device=dev)
            dist.all_reduce(t)
            check(f"all_reduce sum {dtype} n={n}", t, torch.full((n,), world * (world + 1) // 2, dtype=dtype))
            t = torch.full((n,), me + 1, dtype=dtype, device=dev)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            check(f"all_reduce max {dtype} n={n}", t, torch.full((n,), world, dtype=dtype))
        t = torch.full((n,), 2.0 * (me + 1), device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        check(f"all_reduce avg n={n}", t, torch.full((n,), float(world + 1)))
        out = torch.empty(world * n, device=dev)
        dist.all_gather_into_tensor(out, torch.full((n,), float(me), device=dev))
        check(f"all_gather n={n}", out, torch.arange(world, dtype=torch.float32).repeat_interleave(n))
        rs = torch.empty(n, device=dev)
        dist.reduce_scatter_tensor(rs, torch.arange(world * n, dtype=torch.float32, device=dev))
        check(f"reduce_scatter n={n}", rs, world * torch.arange(me * n, (me + 1) * n, dtype=torch.float32))
        b = torch.full((n,), float(me), device=dev)
        dist.broadcast(b, src=world - 1)
        check(f"broadcast n={n}", b, torch.full((n,), float(world - 1)))
        a2a_in = torch.arange(world * n, dtype=torch.float32, device=dev) + 1000 * me
        a2a_out = torch.empty(world * n, device=dev)
        dist.all_to_all_single(a2a_out, a2a_in)
        want = torch.cat([torch.arange(me * n, (me + 1) * n, dtype=torch.float32) + 1000 * r for r in range(world)])
        check(f"all_to_all n={n}", a2a_out, want)
    dist.barrier()
    return {"checks": checks, "failures": failures}


def gpu_ddp() -> dict:
    """DDP parity with the native rank's model on its GPU (the strategy tests' reference, on CPU)."""
    import hal
    from hal.strategies.data_parallel import wrap_ddp
    from hal.strategies.models import build_model
    from hal.strategies.models.data import lm_loss, make_batches, rank_slice
    from tests import _strategy_cases as sc
    dev = hal.accelerator().device
    rank, world = dist.get_rank(), dist.get_world_size()
    model = wrap_ddp(build_model(sc.CFG, sc.MODEL_SEED).to(dev), bucket_cap_mb=0.05)
    opt = torch.optim.SGD(model.parameters(), lr=sc.LR)
    data = make_batches(sc.CFG, sc.STEPS, sc.GLOBAL_BATCH, sc.DATA_SEED)
    for step in range(sc.STEPS):
        mine = rank_slice(data[step], rank, world).to(dev)
        loss = lm_loss(model(mine[:, :-1]), mine[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
    ref, _, _ = sc.reference()
    held = {n: p.detach().cpu() for n, p in model.module.named_parameters()}
    return {"max_param_diff": max((held[n] - ref[n]).abs().max().item() for n in held)}
