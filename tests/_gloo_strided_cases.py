"""Worker-side cases of tests/test_gloo_group.py: every gloo collective on non-contiguous views, through
raw `ProcessGroupGloo` (to record torch's behaviour) and through the HAL's CPU fabric group.

Each view is a column `base[:, 1]` of a (n, 3) tensor, so its elements are 3 apart in storage and
its neighbours (`base[:, 0]`, `base[:, 2]`) hold a sentinel that no collective may touch. A case
returns {collective: None if right, else what was wrong} for this rank.
"""
from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

N = 4
SENTINEL = -7.0
G: dict = {}


def _store(prefix: str) -> dist.Store:
    if "store" not in G:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        G["store"] = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, rank == 0,
                                   timeout=timedelta(seconds=60))
    return dist.PrefixStore(prefix, G["store"])


def _group(kind: str) -> dist.ProcessGroup:
    if kind not in G:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if kind == "raw_gloo":
            G[kind] = dist.ProcessGroupGloo(_store(kind), rank, world, timedelta(seconds=30))
        else:  # the HAL's CPU fabric, as the cpu chip / emulated chips / a gloo plugin build it
            from hal.emulation.emulate import create_cpu_process_group
            os.environ["HAL_CPU_CCL"] = kind
            G[kind] = create_cpu_process_group(_store(kind), rank, world, timedelta(seconds=30))
    return G[kind]


def _col(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(base, view): `view` = base[:, 1] holds `values`; the other columns hold SENTINEL."""
    base = torch.full((values.numel(), 3), SENTINEL)
    base[:, 1] = values
    return base, base[:, 1]


def _data(rank: int, salt: int = 0) -> torch.Tensor:
    return torch.arange(N, dtype=torch.float32) * 10 + rank * 100 + salt + 1


def _check(base: torch.Tensor, want: torch.Tensor) -> str | None:
    got = base[:, 1]
    problems = []
    if not torch.equal(got, want):
        problems.append(f"view {got.tolist()} != {want.tolist()}")
    others = torch.cat([base[:, 0], base[:, 2]])
    if not bool((others == SENTINEL).all()):
        problems.append(f"elements outside the view changed: {base.tolist()}")
    return "; ".join(problems) or None


def strided_collectives(kind: str) -> dict:
    pg = _group(kind)
    rank, world = pg.rank(), pg.size()
    out: dict = {}
    everyone = [_data(r) for r in range(world)]
    total = torch.stack(everyone).sum(0)

    base, v = _col(_data(rank))
    pg.broadcast([v], _opts(dist.BroadcastOptions, rootRank=0)).wait()
    out["broadcast"] = _check(base, everyone[0])

    base, v = _col(_data(rank))
    pg.allreduce([v], _opts(dist.AllreduceOptions, reduceOp=dist.ReduceOp.SUM)).wait()
    out["all_reduce"] = _check(base, total)

    base, v = _col(_data(rank))
    pg.reduce([v], _opts(dist.ReduceOptions, rootRank=0, reduceOp=dist.ReduceOp.SUM)).wait()
    out["reduce"] = _check(base, total) if rank == 0 else None

    bases, views = zip(*[_col(torch.zeros(N)) for _ in range(world)])
    src_base, src = _col(_data(rank))
    pg.allgather([list(views)], [src]).wait()
    out["all_gather"] = next((f"[{r}] {p}" for r, b in enumerate(bases) if (p := _check(b, everyone[r]))), None)

    base, v = _col(torch.zeros(N * world))
    _, src = _col(_data(rank))
    pg._allgather_base(v, src).wait()
    out["all_gather_into_tensor"] = _check(base, torch.cat(everyone))

    bases, views = zip(*[_col(torch.zeros(N)) for _ in range(world)])
    _, src = _col(_data(rank))
    pg.gather([list(views)] if rank == 0 else [], [src], _opts(dist.GatherOptions, rootRank=0)).wait()
    out["gather"] = (next((f"[{r}] {p}" for r, b in enumerate(bases) if (p := _check(b, everyone[r]))), None)
                     if rank == 0 else None)

    base, v = _col(torch.zeros(N))
    chunks = [_col(_data(r, salt=5))[1] for r in range(world)]
    pg.scatter([v], [chunks] if rank == 0 else [], _opts(dist.ScatterOptions, rootRank=0)).wait()
    out["scatter"] = _check(base, _data(rank, salt=5))

    base, v = _col(torch.zeros(N))
    ins = [_col(_data(rank, salt=r))[1] for r in range(world)]
    try:
        pg.reduce_scatter([v], [ins], _opts(dist.ReduceScatterOptions, reduceOp=dist.ReduceOp.SUM)).wait()
        out["reduce_scatter"] = _check(base, torch.stack([_data(r, salt=rank) for r in range(world)]).sum(0))
    except RuntimeError as exc:  # torch 2.5's own gloo has no list reduce_scatter (the HAL's falls back)
        if kind != "raw_gloo":
            raise
        out["reduce_scatter"] = f"refused: {exc}"

    base, v = _col(torch.zeros(N))
    _, src = _col(torch.cat([_data(rank, salt=r) for r in range(world)]))
    pg._reduce_scatter_base(v, src, _opts(dist.ReduceScatterOptions, reduceOp=dist.ReduceOp.SUM)).wait()
    out["reduce_scatter_tensor"] = _check(base, torch.stack([_data(r, salt=rank) for r in range(world)]).sum(0))

    base, v = _col(torch.zeros(N * world))
    _, src = _col(torch.cat([_data(rank, salt=r) for r in range(world)]))
    try:  # torch's gloo refuses this one outright (every rank raises before communicating)
        pg.alltoall_base(v, src, [N] * world, [N] * world, dist.AllToAllOptions()).wait()
        out["all_to_all_single"] = _check(base, torch.cat([_data(r, salt=rank) for r in range(world)]))
    except ValueError as exc:
        out["all_to_all_single"] = f"refused: {exc}"

    if world == 2:
        base, v = _col(torch.zeros(N))
        _, src = _col(_data(rank, salt=9))
        try:  # torch's gloo refuses strided send and recv on each rank, before communicating
            if rank == 0:
                pg.send([src], 1, 3).wait()
                out["send_recv"] = None
            else:
                pg.recv([v], 0, 3).wait()
                out["send_recv"] = _check(base, _data(0, salt=9))
        except RuntimeError as exc:
            out["send_recv"] = f"refused: {exc}"

    # Asynchronous use: the result lands at wait() / in the future's value, not before.
    base, v = _col(_data(rank))
    work = pg.broadcast([v], _opts(dist.BroadcastOptions, rootRank=0))
    fut = work.get_future()
    fut.wait()
    work.wait()
    out["broadcast_future"] = _check(base, everyone[0])
    pg.barrier().wait()
    return out


def contiguous_calls_are_gloos_own() -> dict:
    """For contiguous tensors the fabric hands back gloo's own work (no staging, no extra copy)."""
    pg = _group("gloo")
    t = torch.ones(4)
    work = pg.allreduce([t], _opts(dist.AllreduceOptions, reduceOp=dist.ReduceOp.SUM))
    work.wait()
    return {"type": type(pg).__name__, "work": type(work).__name__, "value": t.tolist(),
            "backend": pg.getBackendName()}


def _opts(cls, **fields):
    o = cls()
    for k, val in fields.items():
        setattr(o, k, val)
    return o


def unsupported_combinations_are_refused() -> dict:
    """What gloo cannot do raises hal.NotSupportedError before reaching gloo; the group still works."""
    from hal.contract.errors import NotSupportedError
    pg = _group("gloo")
    premul = dist._make_nccl_premul_sum(2.0)  # torch's only constructor of a PREMUL_SUM op
    calls = {
        "premul_sum": lambda: pg.allreduce([torch.ones(4)], _opts(dist.AllreduceOptions, reduceOp=premul)),
        "float8": lambda: pg.broadcast([torch.zeros(4, dtype=torch.float8_e4m3fn)],
                                       _opts(dist.BroadcastOptions, rootRank=0)),
        "int16_sum": lambda: pg.allreduce([torch.ones(4, dtype=torch.int16)],
                                          _opts(dist.AllreduceOptions, reduceOp=dist.ReduceOp.SUM)),
        "int64_avg": lambda: pg._reduce_scatter_base(torch.zeros(2, dtype=torch.int64),
                                                     torch.ones(2 * pg.size(), dtype=torch.int64),
                                                     _opts(dist.ReduceScatterOptions, reduceOp=dist.ReduceOp.AVG)),
    }
    out = {}
    for name, call in calls.items():
        try:
            call().wait()
            out[name] = "ran"
        except NotSupportedError as exc:
            out[name] = str(exc)
    t = torch.ones(4)
    pg.allreduce([t], _opts(dist.AllreduceOptions, reduceOp=dist.ReduceOp.SUM)).wait()
    out["after"] = t.tolist()
    return out
