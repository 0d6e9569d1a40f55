"""all_reduce across sub-clusters: the rail path (large messages, pipelined) and the leader path (small).

Rail path, per chunk (k sub-clusters, this rank's sub-cluster has n ranks, m parts, see `topology`):

    intra reduce-scatter (vendor CCL)   each rank gets the sub-cluster's partial sums of its parts
    device -> host                      into pinned staging reused across calls (no copy when emulated)
    rail all_reduce (gloo)              with the homes of the same parts in the other sub-clusters
    host -> device
    intra all_gather (vendor CCL)       every rank gets every part

Chunks of about `chunk_bytes` go through these stages as a software pipeline with at most
`pipeline_depth` chunks in flight: each round waits for the oldest stage of every chunk in flight and
issues its next one, so one chunk's cross transfer overlaps the next chunk's intra reduce-scatter and
the previous chunk's all_gather (inner ops are async; gloo and vendor CCLs run them on their own
threads/streams). Every rank runs the same schedule, so each inner group sees its ops in the same
order on all members (no deadlock), and a chunk's staging slot (chunk index mod depth) is reused
only after that chunk finished.

Lower bound (nccl-tests accounting): with k sub-clusters of n ranks and per-rank cross bandwidth B,
each rank must move 2(k-1)/k * S/n bytes across, so time >= 2(k-1)/k * S / (n * B); a single leader
per sub-cluster is n times worse, which is why only messages of at most `small_bytes` take it
(there, latency dominates: leader path = intra reduce, leader-rail all_reduce, intra broadcast).

bf16 wire (`HAL_BRIDGE_WIRE_DTYPE=bf16`, float32 SUM/AVG only): the cross step sends bfloat16 and
accumulates in float32. A rail all_reduce would add in bfloat16 at every hop, so instead the rail
all-gathers the bfloat16 shards and every member adds them in float32 in sub-cluster order -- the
same inputs in the same order, hence bit-identical results on all ranks. Each sub-cluster's partial
sum is rounded once to bfloat16 (relative error <= 2^-9), so |error| <= 2^-8 * sum_r |x_r| per
element beyond the float32 tolerance. For k <= 4 the bfloat16 all-gather moves no more bytes than a
float32 ring all-reduce ((k-1)/2 vs 2(k-1)/k shard sizes).
"""
from __future__ import annotations

from collections import deque
from typing import Optional

import torch

from . import faults
from .ccl import Handle
from .fabric import CPU, Fabric
from .reduction import ReduceSpec


def all_reduce(fx: Fabric, t: torch.Tensor, spec: ReduceSpec) -> None:
    """In place on contiguous `t` (every rank of the group calls it with the same shape/dtype)."""
    flat = t.view(-1)
    if spec.premul is not None:
        flat.mul_(spec.premul)
    nbytes = flat.numel() * flat.element_size()
    if not fx.topo.rail_mode or nbytes <= fx.config.small_bytes:
        leader_all_reduce(fx, flat, spec.inner)
    else:
        rail_all_reduce(fx, flat, spec.inner)
    if spec.average:
        flat.div_(fx.world)


def _wire(fx: Fabric, buf: torch.Tensor, op: str) -> bool:
    return fx.config.wire_dtype == "bfloat16" and op == "sum" and buf.dtype == torch.float32


def cross_all_reduce(fx: Fabric, rail_index: int, buf: torch.Tensor, op: str, slot) -> Handle:
    """All-reduce host buffer `buf` over one rail (bf16 wire when configured)."""
    ccl = fx.rails[rail_index]
    if not _wire(fx, buf, op):
        return ccl.all_reduce(buf, op)
    n, k = buf.numel(), ccl.size
    send = fx.scratch.get(("wire_send", slot, rail_index), n, torch.bfloat16, CPU)
    send.copy_(buf)
    gathered = fx.scratch.get(("wire_recv", slot, rail_index), k * n, torch.bfloat16, CPU)
    h = ccl.all_gather_into_tensor(gathered, send)

    def accumulate() -> None:
        rows = gathered.view(k, n)
        buf.copy_(rows[0])
        for i in range(1, k):
            buf.add_(rows[i])  # float32 += bfloat16, computed in float32
    return Handle([h], accumulate, h.stage if hasattr(h, "stage") else "")


def leader_all_reduce(fx: Fabric, flat: torch.Tensor, op: str) -> None:
    fx.intra.reduce(flat, 0, op).wait()
    faults.point("all_reduce.leader.cross")
    if fx.index == 0:
        rail = fx.topo.leader_rail
        host = fx.to_host(flat, "leader")
        fx.host_ready()
        cross_all_reduce(fx, rail.index, host, op, "leader").wait()
        fx.from_host(host, flat)
    fx.intra.broadcast(flat, 0).wait()


class _Chunk:
    """One chunk of the rail path, advanced through its stages by `rail_all_reduce`."""
    __slots__ = ("start", "length", "slot", "buf", "shard", "host", "handle", "stage", "padded")
    buf: torch.Tensor     # the chunk, padded to whole parts (set at stage 0)
    shard: torch.Tensor   # this rank's reduced parts (stage 0)
    host: torch.Tensor    # the shard in host memory (stage 1)
    padded: bool

    def __init__(self, start: int, length: int, slot: int):
        self.start, self.length, self.slot = start, length, slot
        self.stage = 0
        self.handle: Optional[Handle] = None


def rail_all_reduce(fx: Fabric, flat: torch.Tensor, op: str) -> None:
    topo = fx.topo
    m = topo.parts
    q = topo.parts_per_rank(fx.cluster)
    i = fx.index
    my_rails = fx.my_rails()
    elem = flat.element_size()
    n_total = flat.numel()
    chunk = max(m, (fx.config.chunk_bytes // elem) // m * m)
    depth = fx.config.pipeline_depth
    dev = flat.device

    def advance(ch: _Chunk) -> None:
        if ch.handle is not None:
            ch.handle.wait()
        if ch.stage == 0:      # issue intra reduce-scatter
            p = -(-ch.length // m)
            ch.padded = m * p != ch.length
            if ch.padded:
                ch.buf = fx.scratch.get(("pad", ch.slot), m * p, flat.dtype, dev)
                ch.buf[:ch.length].copy_(flat[ch.start:ch.start + ch.length])
                ch.buf[ch.length:].zero_()
            else:
                ch.buf = flat[ch.start:ch.start + ch.length]
            ch.shard = fx.scratch.get(("shard", ch.slot), q * p, flat.dtype, dev)
            ch.handle = fx.intra.reduce_scatter_tensor(ch.shard, ch.buf, op)
        elif ch.stage == 1:    # device -> host, issue the rail all_reduce(s)
            faults.point("all_reduce.rail.cross")
            p = ch.shard.numel() // q
            ch.host = fx.to_host(ch.shard, ("rail", ch.slot))
            fx.host_ready()
            hs = []
            for rail in my_rails:
                lo, hi = (rail.first_part - i * q) * p, (rail.end_part - i * q) * p
                hs.append(cross_all_reduce(fx, rail.index, ch.host[lo:hi], op, ("rail", ch.slot)))
            ch.handle = Handle(hs)
        elif ch.stage == 2:    # host -> device, issue intra all_gather
            fx.from_host(ch.host, ch.shard)
            ch.handle = fx.intra.all_gather_into_tensor(ch.buf, ch.shard)
        elif ch.stage == 3:    # copy out of the padded buffer
            if ch.padded:
                flat[ch.start:ch.start + ch.length].copy_(ch.buf[:ch.length])
            ch.handle = None
        ch.stage += 1

    inflight: deque[_Chunk] = deque()
    start = 0
    index = 0
    while start < n_total or inflight:
        for ch in list(inflight):
            advance(ch)
            if ch.stage == 4:
                inflight.popleft()
        if start < n_total and len(inflight) < depth:
            ch = _Chunk(start, min(chunk, n_total - start), index % depth)
            advance(ch)
            inflight.append(ch)
            start += ch.length
            index += 1
