"""Each direction of a rail on its own gloo group: the transport of the bridge's all_to_all rail step.

One gloo group between two ranks is one TCP connection per pair, and gloo does not run both
directions of one pair at link rate: measured on the test bed (docs/performance.md, "Bridge vs flat
gloo on the multi-host test bed", 200 Mb/s per NIC), isend + irecv of S/2 both ways on one group
took 48% of the link model, the same on two groups (one per direction) 92%, one direction alone
97%. So every rail (in rail mode) gets a second gloo group over the same members, the *back* group,
and a rail all_to_all sends each block point to point on the group that carries its direction:

    sender position < receiver position  ->  the rail's own group (`fabric.rails[i]`)
    sender position > receiver position  ->  the back group (`fabric.rails_back[i]`)

so every TCP connection carries one direction only, and a rank's send to its rail peer and its
receive from that peer run on different connections at once. Exact: the blocks are the same bytes
`Ccl.all_to_all_single` would move (sends and receives through `Ccl.send`/`Ccl.recv`, which carry
any dtype the gloo group lacks as bytes). Blocks of 0 elements are not sent.

Two ways to use it: `all_to_all_single` (packed buffers per peer, the staged path of native chips)
and, for host tensors, one message per (source, destination) block (`post_block_recvs`,
`send_blocks`; the tag is the source's group rank): each block is sent from where it lies and
received straight into its place in the output (no packing copies), and a rank's own cross
blocks leave before the relay hand-off of its mates' blocks has finished.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore

from .ccl import Ccl, Handle
from .fabric import CPU, Fabric
from .topology import Rail


def back_group(store, rail: Rail, pos: int, timeout: timedelta, granks: list[int], caps,
               created: list[Any]) -> Ccl:
    """The back group of `rail` for its member at position `pos`; the process group is appended to
    `created` (the fabric's inner groups, aborted on failure). Built right after the rail's own
    group, so every rank creates its groups in one global order (no crosswise waits)."""
    pg = dist.ProcessGroupGloo(PrefixStore(f"hetero/rail_back/{rail.index}", store), pos, len(rail.members),
                               timeout)
    created.append(pg)
    return Ccl(pg, caps, f"rail {rail.index} back gloo group (ranks {[granks[r] for r in rail.members]})",
               pos, len(rail.members), CPU, timeout)


def all_to_all_single(fwd: Ccl, back: Ccl, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int],
                      in_splits: list[int]) -> Handle:
    """`Ccl.all_to_all_single` over a rail with each direction on its own group (flat contiguous 1-D
    `out`/`inp`, splits in elements by rail position): issued, not waited."""
    me, size = fwd.rank, fwd.size
    in_off = [sum(in_splits[:i]) for i in range(size)]
    out_off = [sum(out_splits[:i]) for i in range(size)]
    out[out_off[me]:out_off[me] + out_splits[me]].copy_(inp[in_off[me]:in_off[me] + in_splits[me]])
    works = []
    for peer in range(size):
        if peer == me:
            continue
        if in_splits[peer]:
            works.append((fwd if me < peer else back).send(inp[in_off[peer]:in_off[peer] + in_splits[peer]], peer, 0))
        if out_splits[peer]:
            works.append((fwd if peer < me else back).recv(out[out_off[peer]:out_off[peer] + out_splits[peer]],
                                                           peer, 0))
    return Handle(works, stage=fwd._stage("all_to_all (one direction per group)"))


Piece = tuple[torch.Tensor, int, int]  # (buffer, start, length): a block held on this rank


def _group(fx: Fabric, rail_index: int, sender_pos: int, receiver_pos: int) -> Ccl:
    return fx.rails[rail_index] if sender_pos < receiver_pos else fx.rails_back[rail_index]


def post_block_recvs(fx: Fabric, rails, out: torch.Tensor, out_off: list[int], out_splits: list[int]) -> list[Handle]:
    """Receive every cross block that arrives on this rank's rails straight into `out` (one message
    per source, tag = source). `rails`: the routes' (rail index, per member (senders, arrivals))."""
    works = []
    for index, members in rails:
        rail = fx.topo.rails[index]
        me = rail.members.index(fx.rank)
        for peer, (_, arrivals) in enumerate(members):
            for s in arrivals:
                if out_splits[s]:
                    works.append(_group(fx, index, peer, me).recv(out[out_off[s]:out_off[s] + out_splits[s]], peer, s))
    return works


def send_blocks(fx: Fabric, rails, blocks: dict[tuple[int, int], Piece]) -> list[Handle]:
    """Send the blocks in `blocks` ((source, destination) -> piece) that this rank carries along its
    rails, each as its own message (tag = source); blocks not in `blocks` are sent by a later call."""
    works = []
    for index, members in rails:
        rail = fx.topo.rails[index]
        me = rail.members.index(fx.rank)
        for peer, (senders, _) in enumerate(members):
            for s in senders:
                piece = blocks.get((s, rail.members[peer]))
                if piece is None or not piece[2]:
                    continue
                buf, start, length = piece
                fx.count("a2a_rail_elems", length)
                if peer < me:
                    fx.count("a2a_rail_back_elems", length)
                works.append(_group(fx, index, me, peer).send(buf[start:start + length], peer, s))
    return works
