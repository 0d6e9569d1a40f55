"""all_to_all across sub-clusters over rails (rail-aligned, one cross hop per byte).

Every (source s, destination d) pair in the same sub-cluster goes over the sub-cluster's own CCL.
A cross pair goes over exactly one rail that has d as a member (`hal.topology` rails): the *relay*
of (s, d) is that rail's member in s's sub-cluster; s hands the data to its relay over the intra
CCL, and the relay sends it along the rail straight to d. So every cross byte crosses once, on a
rail, and lands at its destination (no forwarding on the far side), as NCCL's PXN does for
rail-optimised networks. Which rail (`cross_rail`, a function of the topology only, so every rank
computes the same table):

- a rail with d on which s itself sits, if any: then s is its own relay and nothing moves intra
  (3+1: every rank of the 3 shares a rail with the lone rank; 2+1+1: the single ranks share both);
- else the rails with d, picked by s's index inside its sub-cluster, so the sources of a
  sub-cluster spread over d's rails (4+2: ranks 0 and 1 reach rank 5 via rails [2,5] and [3,5]).

Per call, on every rank (sub-cluster c of n ranks, W ranks in the group):

    0. intra all_gather of the n split rows (W int64 each): a relay must know how much each
       sub-cluster mate sends to each of its rail peers (skipped when n = 1)
    1. intra all_to_all_single (vendor CCL): to mate t, the block for t itself (final) followed by
       the blocks for the cross destinations t relays, in destination order
    2. per rail of this rank, one gloo all_to_all_single (async, all rails at once): to rail peer d,
       the blocks that this rank relays to d, in source order; from d's side the same in reverse
    3. copy the final blocks into the output (source order, as torch lays out the result)

Cross bytes per rank: its relayed share, never the whole sub-cluster's (except a lone rank, which
holds the whole sub-cluster); intra bytes: at most the message once more. Exact: data is only
copied. Leader-only topologies (too many parts, see `hal.topology`) keep the direct exchange over
the global gloo group. Host staging (native chips): the relay blocks go device -> pinned host as
they are packed for the rails, and rail results host -> device into the output, the same staging
the rail all_reduce uses; an emulated chip's tensors are CPU tensors already.
"""
from __future__ import annotations

from functools import lru_cache

import torch

from hal.topology import RailLayout

from . import faults
from .ccl import Handle
from .fabric import CPU, Fabric


@lru_cache(maxsize=16)
def cross_rails(topo: RailLayout) -> tuple[tuple[int, ...], ...]:
    """table[s][d] = index of the rail that carries s -> d (-1 for a pair in one sub-cluster)."""
    W = topo.world_size
    table = []
    for s in range(W):
        cs = topo.cluster_of[s]
        row = []
        for d in range(W):
            if topo.cluster_of[d] == cs:
                row.append(-1)
                continue
            cand = topo.rails_of(d)
            own = [r for r in cand if r.members[cs] == s]
            pick = own[0] if own else cand[topo.index_in_cluster[s] % len(cand)]
            row.append(pick.index)
        table.append(tuple(row))
    return tuple(table)


def cross_rail(topo: RailLayout, s: int, d: int) -> int:
    return cross_rails(topo)[s][d]


def _offsets(sizes: list[int]) -> list[int]:
    out, acc = [], 0
    for s in sizes:
        out.append(acc)
        acc += s
    return out


def all_to_all_single(fx: Fabric, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int],
                      in_splits: list[int]) -> None:
    """Flat contiguous tensors; splits in elements (uneven, zeros allowed)."""
    topo = fx.topo
    if not topo.rail_mode:
        _global(fx, out, inp, out_splits, in_splits)
        return
    table = cross_rails(topo)
    W, me, c = topo.world_size, fx.rank, fx.cluster
    mates = topo.subclusters[c].ranks
    n = len(mates)
    dev, dtype = inp.device, inp.dtype
    rails = topo.rails
    in_off, out_off = _offsets(in_splits), _offsets(out_splits)

    # 0. split rows of the sub-cluster mates (rows[s][d] = elements s sends to d)
    rows = {me: list(in_splits)}
    if n > 1:
        mine = torch.tensor(in_splits, dtype=torch.int64).to(dev)
        allrows = torch.empty(n * W, dtype=torch.int64, device=dev)
        fx.intra.all_gather_into_tensor(allrows, mine).wait()
        flat = allrows.tolist()
        rows = {s: flat[j * W:(j + 1) * W] for j, s in enumerate(mates)}

    def relay(s: int, d: int) -> int:
        return rails[table[s][d]].members[c]

    cross = [d for d in range(W) if topo.cluster_of[d] != c]
    # 1. intra exchange: to mate t its own block, then the blocks it relays (destination order)
    relayed: dict[tuple[int, int], torch.Tensor] = {}  # (source mate, cross destination) -> its data here
    if n > 1:
        send_pieces, send_sizes = [], []
        for t in mates:
            pieces = [(in_off[t], in_splits[t])] + [(in_off[d], in_splits[d]) for d in cross if relay(me, d) == t]
            send_pieces += pieces
            send_sizes.append(sum(length for _, length in pieces))
        recv_sizes, layout = [], []
        for s in mates:
            mine_d = [d for d in cross if relay(s, d) == me]
            recv_sizes.append(out_splits[s] + sum(rows[s][d] for d in mine_d))
            layout.append((s, mine_d))
        send = fx.scratch.get(("a2a", "intra_in"), sum(send_sizes), dtype, dev)
        off = 0
        for start, length in send_pieces:
            send[off:off + length].copy_(inp[start:start + length])
            off += length
        fx.count("a2a_relay_elems", sum(sz for t, sz in zip(mates, send_sizes) if t != me)
                 - sum(in_splits[t] for t in mates if t != me))
        recv = fx.scratch.get(("a2a", "intra_out"), sum(recv_sizes), dtype, dev)
        fx.intra.all_to_all_single(recv, send, recv_sizes, send_sizes).wait()
        off = 0
        for s, mine_d in layout:
            out[out_off[s]:out_off[s] + out_splits[s]].copy_(recv[off:off + out_splits[s]])
            off += out_splits[s]
            for d in mine_d:
                relayed[(s, d)] = recv[off:off + rows[s][d]]
                off += rows[s][d]
    else:
        out[out_off[me]:out_off[me] + out_splits[me]].copy_(inp[in_off[me]:in_off[me] + in_splits[me]])
        for d in cross:
            relayed[(me, d)] = inp[in_off[d]:in_off[d] + in_splits[d]]

    # 2. along each rail of this rank: relayed blocks to their destinations
    faults.point("all_to_all.rail.cross")
    jobs = []
    for rail in fx.my_rails():
        send_sizes, recv_sizes, pieces, lands = [], [], [], []
        for peer in rail.members:
            if peer == me:
                send_sizes.append(0)
                recv_sizes.append(0)
                continue
            mine = [relayed[(s, peer)] for s in mates if table[s][peer] == rail.index]
            pieces += mine
            send_sizes.append(sum(p.numel() for p in mine))
            got = [s for s in topo.subclusters[topo.cluster_of[peer]].ranks if table[s][me] == rail.index]
            lands += got
            recv_sizes.append(sum(out_splits[s] for s in got))
        hs = fx.scratch.get(("a2a", "rail_in", rail.index), sum(send_sizes), dtype, CPU)
        off = 0
        for p in pieces:
            hs[off:off + p.numel()].copy_(p, non_blocking=True)
            off += p.numel()
        fx.count("a2a_rail_elems", off)
        hr = fx.scratch.get(("a2a", "rail_out", rail.index), sum(recv_sizes), dtype, CPU)
        jobs.append((rail.index, hs, hr, send_sizes, recv_sizes, lands))
    fx.host_ready()
    handles = [fx.rails[i].all_to_all_single(hr, hs, recv_sizes, send_sizes)
               for i, hs, hr, send_sizes, recv_sizes, lands in jobs]
    Handle(handles).wait()
    # 3. rail results into the output, in source order
    for _, _, hr, _, _, lands in jobs:
        off = 0
        for s in lands:
            out[out_off[s]:out_off[s] + out_splits[s]].copy_(hr[off:off + out_splits[s]], non_blocking=True)
            off += out_splits[s]


def _global(fx: Fabric, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int]) -> None:
    """Leader-only topologies: the direct exchange over the global gloo group."""
    hi = fx.to_host(inp.reshape(-1), "a2a_in")
    ho = fx.host_buffer("a2a_out", out.numel(), out.dtype) if fx.staged(out) else out.view(-1)
    fx.host_ready()
    fx.glob.all_to_all_single(ho, hi, out_splits, in_splits).wait()
    fx.from_host(ho, out)
