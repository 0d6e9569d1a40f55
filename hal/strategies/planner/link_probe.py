"""The host link as the planner sees it under emulation: a send/recv ping-pong between two ranks and
the (latency, bandwidth) fit of its times. Used by `hal train`'s plan auto under timed emulation
(hal/trainer/autoplan.py) and by benchmarks/planner_prediction.py, so both price the same link the same way.
"""
from __future__ import annotations

import statistics
import time
from typing import Sequence

import torch
import torch.distributed as dist


def ping_pong(sizes: Sequence[int], reps: int, barrier_group=None) -> list[float]:
    """One-way seconds per message size (median of `reps` after one warm-up) between rank 0 and the
    last rank (in a mixed map, different chips) over the default group; other ranks only take part in
    the barriers on `barrier_group` (e.g. a gloo bookkeeping group). Every rank returns the list
    (rank 0's and the last rank's are measured; the others' are their barrier times)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    peer = world - 1
    out = []
    for n in sizes:
        buf = torch.zeros(max(1, n // 4))  # float32: n bytes
        times = []
        for _ in range(reps + 1):
            dist.barrier(group=barrier_group)
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, peer)
                dist.recv(buf, peer)
            elif rank == peer:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            times.append((time.perf_counter() - t0) / 2)
        out.append(statistics.median(times[1:]))
    return out


def fit_link(sizes: Sequence[int], seconds: Sequence[float]) -> tuple[float, float]:
    """(latency s, bandwidth B/s) of t = latency + bytes / bandwidth: latency = the smallest message's
    time, bandwidth from the largest (robust to the jitter of a loaded host, where a least-squares
    slope over a few sizes can come out negative)."""
    lat = seconds[0]
    return lat, (sizes[-1] - sizes[0]) / max(seconds[-1] - lat, 1e-9)
