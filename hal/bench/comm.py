"""Collective measurement in the style of nccl-tests over torch.distributed: time, algbw, busbw and
#wrong per message size, on any process group (gloo, hetero, shm, each chip's own CCL).

Runs inside an initialised torch.distributed job (torchrun, or hal.testing.WorkerPool ranks). The
default group is a gloo *control* group (barriers, gathering timings and error counts) so the group
under test carries nothing but the collective being measured. Sizes, medians, bandwidths and the
table are the harness's (`hal.bench.harness`, nccl-tests conventions):

* count = size / the dtype's bytes (rounded down to a multiple of the group size where the op
  splits it);
* time is per operation: each repeat runs `iters` operations back to back (each waited) between
  barriers; a repeat's time is the slowest rank's; the table shows the median over repeats;
* `uneven` (all_to_all only): rank r sends (1 + (r + j) mod n) / (n (n + 1) / 2) of its buffer to
  rank j, so every rank sends the same size but the blocks, and what each rank receives, differ
  (the shape of a MoE token exchange); size is still the send buffer;
* #wrong counts, over all ranks, the output elements that differ from the exact expected value (or
  exceed the dtype's rounding for 16-bit floats) after one more checked run on fresh inputs.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Callable, Optional

import torch
import torch.distributed as dist

from hal.contract.capabilities import torch_dtype

from .harness import BenchError, Row, bandwidths, slowest_median

from . import BACKENDS, DTYPES, OPS  # declared torch-free in hal/bench/__init__.py (for --help)

_SPLITS = ("all_gather", "reduce_scatter", "all_to_all")  # ops whose count splits over the ranks
# torch 2.13 renamed the single-tensor variants (the old names warn); older torch has only the old ones
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


# ---- buffers, the operation, and the correctness check ------------------------------------------

def _count_for(op: str, size_bytes: int, dtype: torch.dtype, n: int) -> int:
    elem = torch.empty((), dtype=dtype).element_size()
    count = max(1, size_bytes // elem)
    if op in _SPLITS:
        count = max(n, count - count % n)
    return count


def _pattern(count: int, offset: int, dtype: torch.dtype) -> torch.Tensor:
    """Small non-negative integers (exact in every dtype, sums of a few ranks included)."""
    return ((torch.arange(count, dtype=torch.int64) + offset) % 5).to(dtype)


def split_count(count: int, n: int, src: int, dst: int, uneven: bool) -> int:
    """Elements rank `src` sends to rank `dst` in an all_to_all of `count` elements per rank over `n`
    ranks: count // n each, or the uneven shares of the module docstring."""
    if not uneven:
        return count // n
    total = n * (n + 1) // 2
    if dst < n - 1:
        return count * (1 + (src + dst) % n) // total
    return count - sum(split_count(count, n, src, j, True) for j in range(n - 1))


class OpCase:
    """Buffers for one (op, size, dtype) on one rank, the call that runs it, and its expected output."""

    def __init__(self, op: str, count: int, dtype: torch.dtype, group, rank: int, n: int,
                 device: torch.device, uneven: bool = False) -> None:
        self.op, self.count, self.dtype, self.group, self.rank, self.n = op, count, dtype, group, rank, n
        self.device = device
        if uneven and op != "all_to_all":
            raise BenchError(f"--uneven applies to --op all_to_all only, got --op {op}")
        self.uneven = uneven
        chunk = count // n if op in _SPLITS else count
        self.chunk = chunk
        if op in ("all_reduce", "broadcast", "reduce"):
            self.inp = torch.empty(count, dtype=dtype, device=device)
            self.out = self.inp
        elif op == "all_gather":
            self.inp = torch.empty(chunk, dtype=dtype, device=device)
            self.out = torch.empty(count, dtype=dtype, device=device)
        elif op == "reduce_scatter":
            self.inp = torch.empty(count, dtype=dtype, device=device)
            self.out = torch.empty(chunk, dtype=dtype, device=device)
        elif op == "all_to_all":
            self.inp = torch.empty(count, dtype=dtype, device=device)
            self.out = torch.empty(sum(self.split(j, rank) for j in range(n)), dtype=dtype, device=device)
        else:
            raise BenchError(f"--op {op!r}: expected one of {OPS}")
        self.fill()

    def split(self, src: int, dst: int) -> int:
        """Elements rank `src` sends to rank `dst` in all_to_all (see `uneven` in the module docstring)."""
        return split_count(self.count, self.n, src, dst, self.uneven)

    def fill(self) -> None:
        """Fresh inputs: rank r sends pattern + r (all_to_all: block j carries r * n + j)."""
        r, n = self.rank, self.n
        if self.op == "all_to_all":
            self.inp.copy_(torch.cat([_pattern(self.split(r, j), r * n + j, self.dtype) for j in range(n)]))
        elif self.op == "broadcast":
            self.inp.copy_(_pattern(self.count, 1, self.dtype) if r == 0 else torch.zeros(self.count, dtype=self.dtype))
        else:
            self.inp.copy_(_pattern(self.inp.numel(), r, self.dtype))

    def run(self) -> None:
        g = self.group
        if self.op == "all_reduce":
            dist.all_reduce(self.inp, group=g)
        elif self.op == "all_gather":
            _all_gather_single(self.out, self.inp, group=g)
        elif self.op == "reduce_scatter":
            _reduce_scatter_single(self.out, self.inp, group=g)
        elif self.op == "all_to_all" and self.uneven:
            n = self.n
            dist.all_to_all_single(self.out, self.inp, [self.split(j, self.rank) for j in range(n)],
                                   [self.split(self.rank, j) for j in range(n)], group=g)
        elif self.op == "all_to_all":
            dist.all_to_all_single(self.out, self.inp, group=g)
        elif self.op == "reduce":
            dist.reduce(self.inp, dst=dist.get_global_rank(g, 0), group=g)
        else:
            dist.broadcast(self.inp, src=dist.get_global_rank(g, 0), group=g)

    def expected(self) -> torch.Tensor:
        """The exact result on this rank, in float64."""
        r, n, c, d = self.rank, self.n, self.chunk, torch.float64
        if self.op in ("all_reduce", "reduce"):  # reduce: the root's buffer (others' are unspecified)
            return sum(_pattern(self.count, k, d) for k in range(n))
        if self.op == "all_gather":
            return torch.cat([_pattern(c, k, d) for k in range(n)])
        if self.op == "reduce_scatter":
            full = sum(_pattern(self.count, k, d) for k in range(n))
            return full[r * c:(r + 1) * c]
        if self.op == "all_to_all":
            return torch.cat([_pattern(self.split(j, r), j * n + r, d) for j in range(n)])
        return _pattern(self.count, 1, d)

    def wrong(self) -> int:
        if self.op == "reduce" and self.rank != 0:
            return 0
        got = self.out.to("cpu", torch.float64)
        want = self.expected()
        if self.dtype.is_floating_point and torch.finfo(self.dtype).bits == 16:
            # exact integers only up to 256 (bf16) / 2048 (fp16): allow the dtype's rounding there
            tol = want.abs() * torch.finfo(self.dtype).eps
            return int(((got - want).abs() > tol).sum())
        return int((got != want).sum())


# ---- groups under test ---------------------------------------------------------------------------

_REGISTERED: set[str] = set()


def _register(name: str, creator: Callable, devices: list[str]) -> None:
    if name not in _REGISTERED:
        dist.Backend.register_backend(name, creator, devices=devices)
        _REGISTERED.add(name)


def _vendor_creator(store, rank, world_size, timeout):
    import hal
    return hal.accelerator().new_process_group(store, rank, world_size, timeout)


@dataclass
class GroupUnderTest:
    group: object          # this rank's group
    label: str             # e.g. "world" or "cuda x2 (emulated)"
    members: list          # global ranks of this rank's group
    all_groups: dict       # label -> members, for every group being measured concurrently


def make_group(backend: str, chips: list[tuple[str, bool]], timeout: timedelta) -> GroupUnderTest:
    """The group under test. `chips` is every rank's (chip, emulated), from the control group.

    vendor: the chip's own CCL (hal.accelerator().new_process_group). A vendor CCL cannot span chips,
    so on a mixed cluster each sub-cluster gets its own group and they are measured concurrently.
    """
    world = dist.get_world_size()
    everyone = list(range(world))
    if backend == "gloo":
        return GroupUnderTest(dist.new_group(everyone, timeout=timeout, backend="gloo"), "world",
                              everyone, {"world": everyone})
    if backend == "hetero":
        import hal.ccl_bridge  # noqa: F401 - registers the backend
        return GroupUnderTest(dist.new_group(everyone, timeout=timeout, backend="hetero"), "world",
                              everyone, {"world": everyone})
    if backend == "shm":
        import hal.emulation.shm  # noqa: F401 - registers the shared-memory fabric's backend "shm" (one host only)
        return GroupUnderTest(dist.new_group(everyone, timeout=timeout, backend="shm"), "world",
                              everyone, {"world": everyone})
    if backend != "vendor":
        raise BenchError(f"--backend {backend!r}: expected one of {BACKENDS}")
    return vendor_groups(chips, timeout)


def sub_clusters(chips: list[tuple[str, bool]]) -> dict[str, list[int]]:
    """label -> global ranks of each sub-cluster (same chip and emulated flag, by lowest rank), as
    `hal.core.topology.rail_layout` groups them for the bridge."""
    from hal.core.topology import rail_layout
    return {f"{g.chip} x{g.size}" + (" (emulated)" if g.emulated else ""): list(g.ranks)
            for g in rail_layout([(c, e) for c, e in chips]).subclusters}


def _groups(labelled: dict[str, list[int]], backend: str, timeout: timedelta) -> GroupUnderTest:
    """One group per entry; every rank creates every group, in the same order; returns this rank's."""
    mine = None
    for label, members in labelled.items():
        g = dist.new_group(members, timeout=timeout, backend=backend)
        if dist.get_rank() in members:
            mine = GroupUnderTest(g, label, members, labelled)
    if mine is None:
        raise BenchError(f"rank {dist.get_rank()} is in none of the groups {labelled}")
    return mine


def vendor_groups(chips: list[tuple[str, bool]], timeout: timedelta) -> GroupUnderTest:
    """Each chip's own CCL (hal.accelerator().new_process_group). A vendor CCL cannot span chips, so
    on a mixed cluster every sub-cluster gets its own group and they are measured concurrently."""
    import hal
    _register("hal_vendor", _vendor_creator, [hal.accelerator().device.type])
    labelled = sub_clusters(chips)
    gut = _groups(labelled, "hal_vendor", timeout)
    if len(labelled) == 1:
        gut.label, gut.all_groups = "world", {"world": gut.members}
    return gut


# ---- the measurement -------------------------------------------------------------------------------

def _barrier() -> None:
    dist.barrier()  # the default (gloo control) group


def measure(op: str, sizes: list[int], dtype_name: str, gut: GroupUnderTest, iters: int = 8,
            warmup: int = 2, repeats: int = 5, device: Optional[torch.device] = None,
            check: bool = True, on_row: Optional[Callable[[list], None]] = None,
            uneven: bool = False) -> list[Row]:
    """Measure `op` at every size on the group under test; every rank calls this and gets all rows."""
    if dtype_name not in DTYPES:
        raise BenchError(f"--dtype {dtype_name!r}: expected one of {list(DTYPES)}")
    for name, value in (("--iters", iters), ("--repeats", repeats)):
        if value < 1:
            raise BenchError(f"{name} must be >= 1, got {value}")
    if warmup < 0:
        raise BenchError(f"--warmup must be >= 0, got {warmup}")
    dtype = torch_dtype(dtype_name)
    device = device or torch.device("cpu")
    n = len(gut.members)
    rank_in = gut.members.index(dist.get_rank())
    world = dist.get_world_size()
    rows: list[Row] = []
    for size in sizes:
        count = _count_for(op, size, dtype, n)
        case = OpCase(op, count, dtype, gut.group, rank_in, n, device, uneven=uneven)
        run = case.run
        for _ in range(warmup):
            run()
        times = []
        for _ in range(repeats):
            _barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                run()
            times.append((time.perf_counter() - t0) / iters)
        wrong = 0
        if check:
            case.fill()
            case.run()
            wrong = case.wrong()
        # every rank's repeat times and error count, through the control group
        mine = torch.tensor(times + [float(wrong)], dtype=torch.float64)
        everyone = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(everyone, mine)
        per_group = []
        for label, members in gut.all_groups.items():
            stacked = torch.stack([everyone[r] for r in members])
            t, slowest = slowest_median(stacked[:, :repeats].tolist())
            m = len(members)
            c = _count_for(op, size, dtype, m)
            nbytes = c * torch.empty((), dtype=dtype).element_size()
            algbw, busbw = bandwidths(op, nbytes, t, m)
            per_group.append(Row(op=op, size_bytes=nbytes, count=c, dtype=dtype_name,
                                 redop="sum" if op in ("all_reduce", "reduce_scatter", "reduce") else "none",
                                 root=0 if op in ("broadcast", "reduce") else -1, time_us=t * 1e6,
                                 algbw_GBps=algbw, busbw_GBps=busbw,
                                 wrong=int(stacked[:, repeats].sum().item()),
                                 repeats_us=[x * 1e6 for x in slowest], group=label))
        rows.extend(per_group)
        if on_row is not None:
            on_row(per_group)
        del case
    return rows


# ---- the measured collective against the link model (hal.core.link_model) --------------------------

@dataclass
class ModelRow:
    """One size against the link-bound model: the backend's and the baseline's algorithm at link rate
    alone (us; None where hal.core.link_model has no algorithm for that backend or op)."""

    size_bytes: int
    model_us: Optional[float]
    baseline_model_us: Optional[float] = None

    def as_dict(self) -> dict:
        return asdict(self)


def link_topology(chips: list[tuple[str, bool]], nodes: list[int], nic_bytes_per_s: Optional[float] = None,
                  intra_bytes_per_s: Optional[float] = None):
    """The job's topology for the link model: every rank's chip and node (torchrun's GROUP_RANK), one
    sub-cluster per chip kind; NIC and intra-node rates the given ones (bytes/s, every chip), else each
    chip's catalog figures (hal.core.topology.links_for)."""
    from hal.core.topology import Topology
    names = [c for c, _ in chips]
    nic = {c: nic_bytes_per_s for c in names} if nic_bytes_per_s is not None else None
    return Topology.from_chips(names, emulated=all(e for _, e in chips), nodes=nodes, nic_bytes_per_s=nic,
                               intra_bytes_per_s=intra_bytes_per_s)


def model_rows(op: str, backend: str, baseline: Optional[str], rows: list[Row], topo,
               uneven: bool = False) -> Optional[list[ModelRow]]:
    """hal.core.link_model's time for each measured size (its `size_bytes` per rank; uneven all_to_all:
    the exact split matrix), for `backend` and `baseline`; None when the op has no model there."""
    from hal.core.link_model import ALGORITHMS, OPS, all_to_all_seconds, collective_seconds
    if op not in OPS or (backend not in ALGORITHMS and baseline not in ALGORITHMS):
        return None
    n = topo.world_size

    def seconds(alg: Optional[str], size: int, elem: int) -> Optional[float]:
        if alg not in ALGORITHMS:
            return None
        if op == "all_to_all" and uneven:
            count = size // elem
            return all_to_all_seconds(topo, alg, [[split_count(count, n, s, d, True) * elem for d in range(n)]
                                                  for s in range(n)]) * 1e6
        return collective_seconds(topo, op, alg, size) * 1e6
    out = []
    for r in rows:
        elem = r.size_bytes // max(1, r.count)
        out.append(ModelRow(r.size_bytes, seconds(backend, r.size_bytes, elem), seconds(baseline, r.size_bytes, elem)))
    return out
