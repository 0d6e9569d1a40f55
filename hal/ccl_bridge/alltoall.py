"""all_to_all across sub-clusters over rails (rail-aligned, one cross hop per byte).

Every (source s, destination d) pair in the same sub-cluster goes over the sub-cluster's own CCL.
A cross pair goes over exactly one rail that has d as a member (`hal.core.topology` rails): the *relay*
of (s, d) is that rail's member in s's sub-cluster; s hands the data to its relay over the intra
CCL, and the relay sends it along the rail straight to d. So every cross byte crosses once, on a
rail, and lands at its destination (no forwarding on the far side), as NCCL's PXN does for
rail-optimised networks. Which rail (`cross_rail`, a function of the topology only, so every rank
computes the same routes; each rank's share of them is built once per topology, `_routes`):

- a rail with d on which s itself sits, if any: then s is its own relay and nothing moves intra
  (3+1: every rank of the 3 shares a rail with the lone rank; 2+1+1: the single ranks share both);
- else the rails with d, picked by s's index inside its sub-cluster, so the sources of a
  sub-cluster spread over d's rails (4+2: ranks 0 and 1 reach rank 5 via rails [2,5] and [3,5]).

Per call, on every rank (sub-cluster c of n ranks, W ranks in the group):

    1a. intra all_to_all_single (vendor CCL) of the intra pairs' blocks, sent from the input and
        received into the output in place when the sub-cluster's ranks are contiguous; issued
        asynchronously, it overlaps everything below
    0.  only in a sub-cluster where some rank relays for another (`relaying`: 2+2, 4+2; not 3+1 or
        2+1+1): intra all_gather of the n split rows (W int64 each), since a relay must know how
        much each mate hands it, then
    1b. intra all_to_all_single: to mate t, the blocks t relays for this rank, by destination
    2.  per rail of this rank, one exchange (all rails at once): to rail peer d, the blocks this
        rank relays to d (its own first), by source; received blocks land in the output by source,
        in place where they are back to back. Each direction of the rail rides its own gloo group
        (the rail's group one way, its back group the other, `duplex`): one gloo pair does not run
        both directions at link rate, two do (docs/performance.md, the test bed). Host tensors
        (emulated chips) go one message per block, sent from the input or the relay buffer and
        received in place, all arrivals posted and this rank's own cross blocks sent before the
        relay hand-off (0, 1b), its mates' blocks right after it; staged tensors (native chips)
        are packed per peer through host staging.

Cross bytes per rank: its relayed share, never the whole sub-cluster's (except a lone rank, which
holds the whole sub-cluster); intra bytes: its intra pairs' blocks plus the blocks it hands to
relays. Exact: data is only
copied. Leader-only topologies (too many parts, see `hal.core.topology`) keep the direct exchange over
the global gloo group. Host staging (native chips): the relay blocks go device -> pinned host as
they are packed for the rails, and rail results host -> device into the output, the same staging
the rail all_reduce uses; an emulated chip's tensors are CPU tensors already.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import torch

from hal.core.topology import RailLayout, cross_rail

from . import duplex, faults
from .ccl import Handle
from .fabric import CPU, Fabric


def cross_rails(topo: RailLayout) -> list[list[int]]:
    """The whole table, table[s][d] (-1 inside one sub-cluster): O(W^2), for tests and reports."""
    W = topo.world_size
    return [[-1 if topo.cluster_of[s] == topo.cluster_of[d] else cross_rail(topo, s, d) for d in range(W)]
            for s in range(W)]


@lru_cache(maxsize=16)
def relaying(topo: RailLayout) -> tuple[bool, ...]:
    """Per sub-cluster: whether some rank of it hands a block to a mate to relay, i.e. some source
    does not share a rail with every rank of another sub-cluster. Where none does (3+1, 2+1+1), a
    relay needs no split sizes from its mates, so step 0 and 1b are skipped."""
    out = [False] * topo.k
    for s in range(topo.world_size):
        c = topo.cluster_of[s]
        for other in topo.subclusters:
            if other.index != c and len({r.members[other.index] for r in topo.rails_of(s)}) < other.size:
                out[c] = True
    return tuple(out)


@dataclass(frozen=True)
class _RankRoutes:
    """What one rank does in every all_to_all on a topology (built once: O(n * W) route lookups)."""

    cross: tuple[int, ...]                          # ranks outside this rank's sub-cluster
    hand_to: tuple[tuple[int, tuple[int, ...]], ...]    # (mate t, destinations t relays for this rank)
    take_from: tuple[tuple[int, tuple[int, ...]], ...]  # (mate t, destinations this rank relays for t)
    own: tuple[int, ...]                            # destinations this rank carries itself
    # per rail of this rank: (rail index, per member: (sources of this sub-cluster whose block for
    # that member this rank sends on the rail, sources of the member's sub-cluster whose block for
    # this rank arrives on it))
    rails: tuple[tuple[int, tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]], ...]


@lru_cache(maxsize=64)
def _routes(topo: RailLayout, me: int) -> _RankRoutes:
    c = topo.cluster_of[me]
    mates = topo.subclusters[c].ranks
    cross = tuple(d for d in range(topo.world_size) if topo.cluster_of[d] != c)

    def relay(s: int, d: int) -> int:
        return topo.rails[cross_rail(topo, s, d)].members[c]
    hand_to = tuple((t, () if t == me else tuple(d for d in cross if relay(me, d) == t)) for t in mates)
    take_from = tuple((t, () if t == me else tuple(d for d in cross if relay(t, d) == me)) for t in mates)
    rails = []
    for rail in topo.rails_of(me):
        per_member: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
        for peer in rail.members:
            if peer == me:
                per_member.append(((), ()))
                continue
            send = tuple(s for s in mates if cross_rail(topo, s, peer) == rail.index)
            recv = tuple(s for s in topo.subclusters[topo.cluster_of[peer]].ranks
                         if cross_rail(topo, s, me) == rail.index)
            per_member.append((send, recv))
        rails.append((rail.index, tuple(per_member)))
    return _RankRoutes(cross=cross, hand_to=hand_to, take_from=take_from,
                       own=tuple(d for d in cross if relay(me, d) == me), rails=tuple(rails))


def _offsets(sizes: list[int]) -> list[int]:
    out, acc = [], 0
    for s in sizes:
        out.append(acc)
        acc += s
    return out


Piece = tuple[torch.Tensor, int, int]  # (buffer, start, length): a block held on this rank


def _run(pieces: list[Piece]) -> Optional[torch.Tensor]:
    """The pieces as one view when they are back to back in one buffer (no packing copy), else None."""
    if not pieces:
        return None
    base, first, pos = pieces[0][0], pieces[0][1], pieces[0][1]
    for buf, start, length in pieces:
        if buf is not base or start != pos:
            return None
        pos += length
    return base[first:pos]


def all_to_all_single(fx: Fabric, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int],
                      in_splits: list[int]) -> None:
    """Flat contiguous tensors; splits in elements (uneven, zeros allowed)."""
    topo = fx.topo
    if not topo.rail_mode:
        _global(fx, out, inp, out_splits, in_splits)
        return
    me, c = fx.rank, fx.cluster
    mates = topo.subclusters[c].ranks
    routes = _routes(topo, me)
    in_off, out_off = _offsets(in_splits), _offsets(out_splits)
    # 1a. intra pairs: every mate's own block, straight from the input into the output where the
    #     sub-cluster's ranks are contiguous (issued, not waited: it overlaps the steps below)
    intra = _exchange(fx, fx.intra, out, [(inp, in_off[t], in_splits[t]) for t in mates],
                      [(s, out_off[s], out_splits[s]) for s in mates], [in_splits[t] for t in mates],
                      [out_splits[s] for s in mates], ("a2a", "intra"), False, inp.device)
    own = {(me, d): (inp, in_off[d], in_splits[d]) for d in routes.own}
    if fx.rails_back and fx.block_a2a:  # decided for the whole group (backend.block_all_to_all)
        # 2, one message per block (duplex): every arrival posted, this rank's own cross blocks sent
        # at once, the blocks it relays for its mates once the hand-off (0, 1b) has brought them
        faults.point("all_to_all.rail.cross")
        works = duplex.post_block_recvs(fx, routes.rails, out, out_off, out_splits)
        works += duplex.send_blocks(fx, routes.rails, own)
        if relaying(topo)[c]:
            relayed = _relay_exchange(fx, inp, in_splits, in_off, routes)
            works += duplex.send_blocks(fx, routes.rails, {k: v for k, v in relayed.items() if k[0] != me})
        Handle([intra, *works]).wait()
        return
    if relaying(topo)[c]:
        relayed = _relay_exchange(fx, inp, in_splits, in_off, routes)
    else:  # every source is its own relay
        relayed = {(me, d): (inp, in_off[d], in_splits[d]) for d in routes.cross}

    # 2. along each rail of this rank: relayed blocks to their destinations (packed per peer)
    faults.point("all_to_all.rail.cross")
    handles = []
    for index, members in routes.rails:
        send_sizes, recv_sizes, pieces, lands = [], [], [], []
        for peer, (senders, arrivals) in zip(topo.rails[index].members, members):
            mine = [relayed[(s, peer)] for s in senders]
            pieces += mine
            lands += [(s, out_off[s], out_splits[s]) for s in arrivals]
            send_sizes.append(sum(p[2] for p in mine))
            recv_sizes.append(sum(out_splits[s] for s in arrivals))
        fx.count("a2a_rail_elems", sum(send_sizes))
        if index in fx.rails_back:   # elements sent to lower rail positions: the back group's direction
            fx.count("a2a_rail_back_elems", sum(send_sizes[:topo.rails[index].members.index(me)]))
        handles.append(_exchange(fx, fx.rails[index], out, pieces, lands, send_sizes, recv_sizes,
                                 ("a2a", "rail", index), True, CPU, fx.rails_back.get(index)))
    Handle([intra] + handles).wait()


def _exchange(fx: Fabric, ccl, out: torch.Tensor, pieces: list[Piece],
              lands: list[tuple[int, int, int]], send_sizes: list[int], recv_sizes: list[int], slot,
              host: bool, dev: torch.device, back=None) -> Handle:
    """Issue one all_to_all_single on `ccl` (with `back`, a rail's back group: each direction on its
    own group, `duplex`): send `pieces` (in peer order, `send_sizes` per peer),
    receive blocks that land in `out` at (source, offset, length) in `lands`. Views of the caller's
    tensors are used where the blocks are back to back and no host staging is needed; otherwise
    blocks are packed into (host, for `host`) scratch buffers, the copies that stage a native chip's
    data anyway."""
    staged = host and (fx.staged(out) or any(fx.staged(p[0]) for p in pieces))
    send = None if staged else _run(pieces)
    if send is None:
        send = fx.scratch.get(slot + ("in",), sum(send_sizes), out.dtype, dev)
        off = 0
        for buf, start, length in pieces:
            send[off:off + length].copy_(buf[start:start + length], non_blocking=True)
            off += length
    view = None if staged else _run([(out, o, n) for _, o, n in lands])
    direct = view is not None
    recv = view if view is not None else fx.scratch.get(slot + ("out",), sum(recv_sizes), out.dtype, dev)
    if host:
        fx.host_ready()
    if back is not None:
        h = duplex.all_to_all_single(ccl, back, recv, send, recv_sizes, send_sizes)
    else:
        h = ccl.all_to_all_single(recv, send, recv_sizes, send_sizes)

    def unpack() -> None:
        off = 0
        for _, start, length in lands:
            out[start:start + length].copy_(recv[off:off + length], non_blocking=True)
            off += length
    return h if direct else Handle([h], unpack, getattr(h, "stage", ""))


def _relay_exchange(fx: Fabric, inp: torch.Tensor, in_splits: list[int], in_off: list[int],
                    routes: _RankRoutes) -> dict[tuple[int, int], Piece]:
    """Steps 0 and 1b where some mates relay for others: returns the blocks this rank relays,
    keyed (source mate, cross destination). Blocks this rank relays itself stay in the input."""
    topo = fx.topo
    W, me = topo.world_size, fx.rank
    mates = topo.subclusters[fx.cluster].ranks
    n = len(mates)
    dev, dtype = inp.device, inp.dtype
    # 0. split rows of the sub-cluster mates (rows[s][d] = elements s sends to d)
    mine = torch.tensor(in_splits, dtype=torch.int64).to(dev)
    allrows = torch.empty(n * W, dtype=torch.int64, device=dev)
    fx.intra.all_gather_into_tensor(allrows, mine).wait()
    flat = allrows.tolist()
    rows = {s: flat[j * W:(j + 1) * W] for j, s in enumerate(mates)}
    # 1b. to mate t != me: the blocks t relays for this rank, by destination
    relayed: dict[tuple[int, int], Piece] = {(me, d): (inp, in_off[d], in_splits[d]) for d in routes.own}
    pieces: list[Piece] = [(inp, in_off[d], in_splits[d]) for _, dests in routes.hand_to for d in dests]
    send_sizes = [sum(in_splits[d] for d in dests) for _, dests in routes.hand_to]
    recv_sizes = [sum(rows[t][d] for d in dests) for t, dests in routes.take_from]
    fx.count("a2a_relay_elems", sum(send_sizes))
    send = _run(pieces)
    if send is None:
        send = fx.scratch.get(("a2a", "relay", "in"), sum(send_sizes), dtype, dev)
        off = 0
        for buf, start, length in pieces:
            send[off:off + length].copy_(buf[start:start + length])
            off += length
    recv = fx.scratch.get(("a2a", "relay", "out"), sum(recv_sizes), dtype, dev)
    fx.intra.all_to_all_single(recv, send, recv_sizes, send_sizes).wait()
    off = 0
    for t, dests in routes.take_from:
        for d in dests:
            relayed[(t, d)] = (recv, off, rows[t][d])
            off += rows[t][d]
    return relayed


def _global(fx: Fabric, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int]) -> None:
    """Leader-only topologies: the direct exchange over the global gloo group."""
    hi = fx.to_host(inp.reshape(-1), "a2a_in")
    ho = fx.host_buffer("a2a_out", out.numel(), out.dtype) if fx.staged(out) else out.view(-1)
    fx.host_ready()
    fx.glob.all_to_all_single(ho, hi, out_splits, in_splits).wait()
    fx.from_host(ho, out)
