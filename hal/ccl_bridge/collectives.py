"""The bridge's other collectives: reduce-scatter and all-gather along rails, broadcast through a rail,
all_to_all over rails (`alltoall`), gather and scatter over the global gloo group.

Layout shared by reduce_scatter_tensor and all_gather_into_tensor (rail mode). Rank r's block of the
big tensor is its *chunk* (N elements). The *block* of sub-cluster c is the chunks of its ranks. With
m parts (see `topology`), each chunk of a sub-cluster c' rank is cut into q' = m/n_{c'} sub-parts of
s' = ceil(N/q') elements, so block c' has exactly m parts and part J belongs to the chunk of the
rank with index J // q'. All parts are padded to p = max s' so that rail buffers have equal shares.
A rank of sub-cluster c with index i is home of parts [i*q, (i+1)*q) of *every* block; it keeps them
in its *share*, laid out [block][part][p].

- reduce_scatter: intra reduce-scatter of the shares (partial sums over the sub-cluster), then per
  rail a gloo reduce-scatter in which the member from sub-cluster c' receives block c' -- for this
  rank exactly the sub-parts of its own chunk. Two steps; each rank sends its share once across.
- all_gather: the mirror: per rail a gloo all-gather of each member's own sub-parts, then an intra
  all-gather of the shares, then unpacking into rank order.

Without rails (leader-only topologies) both run on the global gloo group. all_to_all(_single) takes
the rails (intra hand-off to the relay, one rail hop to the destination; `alltoall` explains it).
gather and scatter run on the global gloo group: rooted, they move at most W blocks through one
rank, which no rail layout can spread.
"""
from __future__ import annotations

from typing import Optional

import torch

from hal.contract.errors import NotSupportedError

from . import alltoall as _a2a
from .ccl import Handle
from .fabric import CPU, Fabric
from .reduction import ReduceSpec


def _geometry(fx: Fabric, n: int):
    topo = fx.topo
    m = topo.parts
    qs = [topo.parts_per_rank(c) for c in range(topo.k)]
    ss = [-(-n // q) if n else 0 for q in qs]
    p = max(max(ss), 1)
    return m, qs, ss, p


def _part_src(fx: Fabric, block: int, J: int, n: int, qs, ss) -> tuple[int, int, int]:
    """(owner group rank, start, end) of part J of block `block`, offsets inside the owner's chunk."""
    sc = fx.topo.subclusters[block]
    owner = sc.ranks[J // qs[block]]
    sp = J % qs[block]
    lo = min(sp * ss[block], n)
    return owner, lo, min(lo + ss[block], n)


def reduce_scatter_tensor(fx: Fabric, out: torch.Tensor, inp: torch.Tensor, spec: ReduceSpec) -> None:
    """`out` flat N elements, `inp` flat W*N, both contiguous."""
    n = out.numel()
    if not fx.topo.rail_mode:
        _global_reduce_scatter(fx, out, inp, spec)
        return
    topo = fx.topo
    k = topo.k
    m, qs, ss, p = _geometry(fx, n)
    c, i = fx.cluster, fx.index
    q = qs[c]
    nc = topo.subclusters[c].size
    dev = inp.device
    share_len = k * q * p
    z = fx.scratch.get("rs_in", nc * share_len, inp.dtype, dev)
    zv = z.view(nc, k, q, p)
    for ii in range(nc):
        for b in range(k):
            for j in range(q):
                owner, lo, hi = _part_src(fx, b, ii * q + j, n, qs, ss)
                dst = zv[ii, b, j]
                if hi > lo:
                    dst[:hi - lo].copy_(inp[owner * n + lo:owner * n + hi])
                if hi - lo < p:
                    dst[hi - lo:].zero_()
    if spec.premul is not None:
        z.mul_(spec.premul)
    share = fx.scratch.get("rs_share", share_len, inp.dtype, dev)
    fx.intra.reduce_scatter_tensor(share, z, spec.inner).wait()
    host = fx.to_host(share, "rs")
    fx.host_ready()
    hv = host.view(k, q, p)
    handles, outs = [], []
    for rail in fx.my_rails():
        la, lb = rail.first_part - i * q, rail.end_part - i * q
        width = (lb - la) * p
        if lb - la == q:
            x = host
        else:
            x = fx.scratch.get(("rs_rail_in", rail.index), k * width, inp.dtype, CPU)
            x.view(k, lb - la, p).copy_(hv[:, la:lb])
        y = fx.scratch.get(("rs_rail_out", rail.index), width, inp.dtype, CPU)
        handles.append(fx.rails[rail.index].reduce_scatter_tensor(y, x, spec.inner))
        outs.append((la, lb, y))
    for h in handles:
        h.wait()
    flat = out.view(-1)
    s = ss[c]
    for la, lb, y in outs:
        yv = y.view(lb - la, p)
        for j in range(la, lb):
            lo = min(j * s, n)
            hi = min(lo + s, n)
            if hi > lo:
                flat[lo:hi].copy_(yv[j - la, :hi - lo], non_blocking=True)
    if spec.average:
        flat.div_(fx.world)


def _global_reduce_scatter(fx: Fabric, out: torch.Tensor, inp: torch.Tensor, spec: ReduceSpec) -> None:
    x = inp
    if spec.premul is not None:
        x = inp * spec.premul
    hx = fx.to_host(x, "grs_in")
    ho = fx.host_buffer("grs_out", out.numel(), out.dtype) if fx.staged(out) else out.view(-1)
    fx.host_ready()
    fx.glob.reduce_scatter_tensor(ho, hx, spec.inner).wait()
    fx.from_host(ho, out)
    if spec.average:
        out.div_(fx.world)


def all_gather_into_tensor(fx: Fabric, out: torch.Tensor, inp: torch.Tensor) -> None:
    """`inp` flat N elements, `out` flat W*N, both contiguous."""
    n = inp.numel()
    if not fx.topo.rail_mode:
        hi_ = fx.to_host(inp, "gag_in")
        ho = fx.host_buffer("gag_out", out.numel(), out.dtype) if fx.staged(out) else out.view(-1)
        fx.host_ready()
        fx.glob.all_gather_into_tensor(ho, hi_).wait()
        fx.from_host(ho, out)
        return
    topo = fx.topo
    k = topo.k
    m, qs, ss, p = _geometry(fx, n)
    c, i = fx.cluster, fx.index
    q = qs[c]
    s = ss[c]
    nc = topo.subclusters[c].size
    dev = inp.device
    src = fx.to_host(inp, "ag_in")
    fx.host_ready()
    handles, parts = [], []
    single = False
    for rail in fx.my_rails():
        la, lb = rail.first_part - i * q, rail.end_part - i * q
        width = (lb - la) * p
        mine = fx.scratch.get(("ag_rail_in", rail.index), width, inp.dtype, CPU)
        mv = mine.view(lb - la, p)
        for j in range(la, lb):
            lo = min(j * s, n)
            hi = min(lo + s, n)
            if hi > lo:
                mv[j - la, :hi - lo].copy_(src[lo:hi])
            if hi - lo < p:
                mv[j - la, hi - lo:].zero_()
        g = fx.scratch.get(("ag_rail_out", rail.index), k * width, inp.dtype, CPU)
        handles.append(fx.rails[rail.index].all_gather_into_tensor(g, mine))
        parts.append((la, lb, g))
        single = lb - la == q
    for h in handles:
        h.wait()
    if single and len(parts) == 1:
        share_host = parts[0][2]
    else:
        share_host = fx.host_buffer("ag_share", k * q * p, inp.dtype)
        sv = share_host.view(k, q, p)
        for la, lb, g in parts:
            sv[:, la:lb].copy_(g.view(k, lb - la, p))
    share = share_host
    if fx.staged(inp):
        share = fx.scratch.get("ag_share_dev", k * q * p, inp.dtype, dev)
        share.copy_(share_host, non_blocking=True)
    full = fx.scratch.get("ag_full", nc * k * q * p, inp.dtype, dev)
    fx.intra.all_gather_into_tensor(full, share).wait()
    fv = full.view(nc, k, q, p)
    flat = out.view(-1)
    for ii in range(nc):
        for b in range(k):
            for j in range(q):
                owner, lo, hi = _part_src(fx, b, ii * q + j, n, qs, ss)
                if hi > lo:
                    flat[owner * n + lo:owner * n + hi].copy_(fv[ii, b, j, :hi - lo])


def broadcast(fx: Fabric, t: torch.Tensor, root: int) -> None:
    """Root's rail carries the data across (root is its own sub-cluster's member of that rail), then
    every sub-cluster broadcasts from its rail member. Leader-only topologies first bring the data to
    the root sub-cluster's leader."""
    flat = t.view(-1)
    topo = fx.topo
    rc = topo.cluster_of[root]
    rail = topo.rail_with(root)
    if rail is None:  # leader-only topology and root is not a leader
        if fx.cluster == rc:
            fx.intra.broadcast(flat, topo.index_in_cluster[root]).wait()
        rail = topo.leader_rail
    if fx.rank in rail.members:
        host = fx.to_host(flat, "bcast")
        fx.host_ready()
        fx.rails[rail.index].broadcast(host, rc).wait()
        fx.from_host(host, flat)
    if topo.rail_with(root) is not None or fx.cluster != rc:
        fx.intra.broadcast(flat, rail.homes[fx.cluster]).wait()


# ---- over the global gloo group ------------------------------------------------------------------
def _staged(fx: Fabric, t: Optional[torch.Tensor], slot) -> Optional[torch.Tensor]:
    return None if t is None else fx.to_host(t.reshape(-1), slot)


def gather(fx: Fabric, out: Optional[torch.Tensor], inp: torch.Tensor, root: int) -> None:
    hi = _staged(fx, inp, "g_in")
    ho = None
    if out is not None:
        ho = fx.host_buffer("g_out", out.numel(), out.dtype) if fx.staged(out) else out.view(-1)
    fx.host_ready()
    fx.glob.gather(ho, hi, root).wait()
    if out is not None:
        fx.from_host(ho, out)


def scatter(fx: Fabric, out: torch.Tensor, inp: Optional[torch.Tensor], root: int) -> None:
    hi = _staged(fx, inp, "s_in")
    ho = fx.host_buffer("s_out", out.numel(), out.dtype) if fx.staged(out) else out.view(-1)
    fx.host_ready()
    fx.glob.scatter(ho, hi, root).wait()
    fx.from_host(ho, out)


def all_to_all_single(fx: Fabric, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int],
                      in_splits: list[int]) -> None:
    """Flat contiguous tensors; splits in elements. Over rails (see `alltoall`)."""
    _a2a.all_to_all_single(fx, out, inp, out_splits, in_splits)


def barrier(fx: Fabric) -> None:
    fx.glob.barrier().wait()


# ---- point to point --------------------------------------------------------------------------------
def p2p_route(fx: Fabric, peer: int, dtype: torch.dtype):
    """(Ccl, peer rank inside it): the sub-cluster's CCL for a peer in the same sub-cluster when it can
    do send/recv for the dtype natively or bytewise, else the global gloo group."""
    topo = fx.topo
    if topo.cluster_of[peer] == fx.cluster:
        try:
            r = fx.intra.route("send_recv", dtype)
        except NotSupportedError:
            r = ""
        if r == "native" or r.startswith("bits:"):
            return fx.intra, topo.index_in_cluster[peer]
    return fx.glob, peer


def send(fx: Fabric, t: torch.Tensor, dst: int, tag: int) -> Handle:
    ccl, peer = p2p_route(fx, dst, t.dtype)
    if ccl is fx.glob and fx.staged(t):
        host = t.reshape(-1).to(CPU)  # a fresh host copy: the send may outlive this call
        return ccl.send(host, peer, tag)
    return ccl.send(t.reshape(-1) if t.is_contiguous() else t.contiguous().view(-1), peer, tag)


def recv(fx: Fabric, t: torch.Tensor, src: int, tag: int) -> Handle:
    ccl, peer = p2p_route(fx, src, t.dtype)
    if ccl is fx.glob and fx.staged(t):
        host = torch.empty(t.numel(), dtype=t.dtype)
        h = ccl.recv(host, peer, tag)
        return Handle([h], lambda: t.view(-1).copy_(host), h.stage)
    return ccl.recv(t.view(-1), peer, tag)
