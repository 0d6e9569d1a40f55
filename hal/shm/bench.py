"""Bus bandwidth of the shm fabric against gloo, per size, measured in one run (ratios, not absolutes).

    rows = measure(world_sizes=(2, 4), ops=("all_reduce", "all_gather"))
    print(format_table(rows))

`measure` starts one WorkerPool per world size; every rank builds both groups on one store and, for
each size, alternates the backends within every repeat so that machine noise hits both alike. A
repeat's time is the slowest rank's mean over its iterations; reported figures are the median over
repeats. busbw follows nccl-tests: all_reduce bytes x 2(n-1)/n, all_gather total bytes x (n-1)/n.
`hal bench comm` calls `measure` with backend name "shm".
"""
from __future__ import annotations

import os
import statistics
import time
from datetime import timedelta
from typing import Iterable, Optional

SIZES = tuple(4096 * 4 ** k for k in range(8))  # 4 KiB .. 64 MiB
OPS = ("all_reduce", "all_gather")
BACKENDS = ("shm", "gloo")


def busbw_factor(op: str, n: int) -> float:
    return {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
            "all_to_all": (n - 1) / n, "broadcast": 1.0}[op]


def _iters(nbytes: int) -> int:
    """Enough iterations that one repeat is not just timer noise, few enough for 64 MiB."""
    return max(2, min(100, (8 << 20) // max(1, nbytes)))


def _groups(backends: Iterable[str], timeout: timedelta) -> dict:
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, rank == 0,
                          timeout=timeout)
    out = {}
    for b in backends:
        prefixed = dist.PrefixStore(f"bench_{b}", store)
        if b == "shm":
            from . import create_shm_process_group
            out[b] = create_shm_process_group(prefixed, rank, world, timeout)
        elif b == "gloo":
            out[b] = dist.ProcessGroupGloo(prefixed, rank, world, timeout)
        else:
            raise ValueError(f"unknown backend {b!r}; expected one of {BACKENDS}")
    return out


def _rank_main(backends: list, ops: list, sizes: list, repeats: int, timeout_s: float) -> dict:
    """Runs on every rank (WorkerPool): {(backend, op, nbytes): [seconds per op, one per repeat]}."""
    import torch
    import torch.distributed as dist

    world = int(os.environ["WORLD_SIZE"])
    groups = _groups(backends, timedelta(seconds=timeout_s))
    opts = dist.AllreduceOptions()
    times: dict = {}
    for op in ops:
        for nbytes in sizes:
            numel = max(1, nbytes // 4)
            if op == "all_reduce":
                x = torch.ones(numel)
                calls = {b: (lambda g=g: g.allreduce([x], opts).wait()) for b, g in groups.items()}
            elif op == "all_gather":  # nbytes = total gathered, as nccl-tests counts it
                per = max(1, numel // world)
                x, y = torch.ones(per), torch.empty(per * world)
                calls = {b: (lambda g=g: g._allgather_base(y, x).wait()) for b, g in groups.items()}
            else:
                raise ValueError(f"unknown op {op!r}; expected one of {OPS}")
            iters = _iters(nbytes)
            for call in calls.values():  # warm-up: page faults, connection set-up
                call()
            for _ in range(repeats):
                for b, call in calls.items():
                    groups[b].barrier().wait()
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        call()
                    times.setdefault((b, op, nbytes), []).append((time.perf_counter() - t0) / iters)
    for g in groups.values():
        g.barrier().wait()
    return times


def measure(world_sizes: Iterable[int] = (2, 4), ops: Iterable[str] = OPS, sizes: Iterable[int] = SIZES,
            backends: Iterable[str] = BACKENDS, repeats: int = 5, timeout_s: float = 300.0) -> list[dict]:
    """One row per (world size, op, size, backend): median seconds per op, algbw and busbw in GB/s."""
    from ..testing import WorkerPool

    rows = []
    for n in world_sizes:
        with WorkerPool(n) as pool:
            per_rank = pool.run(_rank_main, list(backends), list(ops), list(sizes), repeats, timeout_s,
                                timeout=timeout_s * 4)
        for key in per_rank[0]:
            backend, op, nbytes = key
            # a repeat lasts as long as its slowest rank
            slowest = [max(r[key][i] for r in per_rank) for i in range(repeats)]
            t = statistics.median(slowest)
            algbw = nbytes / t / 1e9
            rows.append({"backend": backend, "world_size": n, "op": op, "bytes": nbytes, "seconds": t,
                         "algbw_GBps": algbw, "busbw_GBps": algbw * busbw_factor(op, n), "repeats": repeats})
    return rows


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def format_table(rows: list[dict], baseline: str = "gloo", candidate: str = "shm") -> str:
    """Per (ranks, op, size): both busbw figures, both latencies and candidate/baseline ratios."""
    by = {(r["world_size"], r["op"], r["bytes"], r["backend"]): r for r in rows}
    keys = sorted({(r["world_size"], r["op"], r["bytes"]) for r in rows})
    lines = [f"{'ranks':>5} {'op':<11} {'size':>7} {candidate + ' busbw':>11} {baseline + ' busbw':>11} "
             f"{candidate + ' us':>10} {baseline + ' us':>10} {'speed-up':>8}"]
    for n, op, nbytes in keys:
        c, b = by.get((n, op, nbytes, candidate)), by.get((n, op, nbytes, baseline))
        if not c or not b:
            continue
        lines.append(f"{n:>5} {op:<11} {_size(nbytes):>7} {c['busbw_GBps']:>9.2f}GB/s {b['busbw_GBps']:>9.2f}GB/s "
                     f"{c['seconds'] * 1e6:>10.1f} {b['seconds'] * 1e6:>10.1f} {b['seconds'] / c['seconds']:>7.1f}x")
    return "\n".join(lines)


def speedup(rows: list[dict], world_size: int, op: str, nbytes: int, baseline: str = "gloo",
            candidate: str = "shm") -> Optional[float]:
    """baseline time / candidate time for one cell (None if not measured)."""
    by = {(r["world_size"], r["op"], r["bytes"], r["backend"]): r["seconds"] for r in rows}
    c, b = by.get((world_size, op, nbytes, candidate)), by.get((world_size, op, nbytes, baseline))
    return b / c if c and b else None
