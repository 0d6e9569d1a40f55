"""Functions the bridge tests run on every rank of a WorkerPool (module level: the pool imports them).

Every check compares the `hetero` group with (a) an exact reference (the same reduction by flat gloo
in float64/int64, or every rank's input regenerated from its seed for data-moving collectives) and
(b) a flat gloo group over the same ranks running the same call, where gloo supports the combination. Integers, bool, MAX/MIN and every
data-moving collective must match bit for bit; float sums within `tolerance` (ccl_bridge docs).
Each function returns a dict with the number of checks made and a list of failures (strings naming
collective, dtype, op, size and the largest difference), so the test asserts on what was checked.
"""
from __future__ import annotations

import datetime
import os
import time
from typing import Optional

import torch
import torch.distributed as dist

from hal.contract.capabilities import DTYPES, TORCH_REDUCE_OPS, torch_dtype
from hal.contract import compat

G: dict = {}
# torch 2.13 renamed the tensor variants (the old names warn); accept either.
_RS = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_AG = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
DT = {n: torch_dtype(n) for n in DTYPES if not n.startswith("float8")}  # hal's name table, float8 aside
OPS = TORCH_REDUCE_OPS  # hal's reduce-op name table


# ---- setup --------------------------------------------------------------------------------------
def topology(group_ranks: list) -> Optional[dict]:
    pg = _group(group_ranks, None)[0]
    return pg.fabric.topo.describe() if dist.get_rank() in group_ranks else None


def setup(timeout_s: float = 30.0) -> dict:
    import hal.ccl_bridge  # registers "hetero"
    if not dist.is_initialized():
        dist.init_process_group("hetero", timeout=datetime.timedelta(seconds=timeout_s))
    G["gloo"] = dist.new_group(backend="gloo")
    pg = dist.group.WORLD
    info = {"type": type(pg).__name__, "backend": dist.get_backend(pg)}
    if isinstance(pg, hal.ccl_bridge.HeteroProcessGroup):
        info["topology"] = pg.fabric.topo.describe()
    return info


def world_group_kind() -> tuple:
    import hal
    pg = dist.group.WORLD
    backend = pg._get_backend(torch.device("cpu")) if type(pg) is dist.ProcessGroup else pg
    backend = getattr(backend, "gloo", backend)  # hal.emulation.gloo_group.StridedSafeGloo wraps ProcessGroupGloo
    t = torch.ones(3) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return type(pg).__name__, type(backend).__name__, hal.accelerator().chip.name, t.tolist()


# ---- inputs and references ------------------------------------------------------------------------
def make_input(seed: int, rank: int, n: int, dtype: torch.dtype, op: str = "sum") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    if dtype in FLOATS:
        x = torch.rand(n, generator=g, dtype=torch.float64 if dtype == torch.float64 else torch.float32)
        return (x + 0.5 if op == "product" else x * 4 - 2).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype in (torch.int8, torch.uint8, torch.int16):
        info = torch.iinfo(dtype)
        return torch.randint(info.min, info.max + 1, (n,), generator=g, dtype=torch.int64).to(dtype)
    lim = 2 ** 20 if op != "product" else 2 ** 12
    return torch.randint(-lim, lim, (n,), generator=g, dtype=torch.int64).to(dtype)


def _gloo_has(coll: str, dtype: torch.dtype, op: Optional[str] = None) -> bool:
    """Whether torch's own gloo (the `gl` reference groups) does it right on this torch, as measured."""
    from hal.contract.capabilities import dtype_name
    from hal.emulation.gloo_fallback import native_entries
    return (coll, dtype_name(dtype), op or "-") in native_entries()


def _cmp(name: str, got: torch.Tensor, want: torch.Tensor, tol: Optional[torch.Tensor], failures: list) -> None:
    if got.shape != want.shape:
        failures.append(f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}")
        return
    if tol is None or got.dtype not in FLOATS:
        if not torch.equal(got.reshape(-1).cpu(), want.reshape(-1).to(got.dtype).cpu()):
            bad = (got.reshape(-1).cpu() != want.reshape(-1).to(got.dtype).cpu()).nonzero()
            i = int(bad[0]) if len(bad) else -1
            failures.append(f"{name}: {len(bad)} elements differ (first at {i}: {got.reshape(-1)[i].item()} vs "
                            f"{want.reshape(-1)[i].item()})")
        return
    diff = (got.reshape(-1).to(torch.float64) - want.reshape(-1).to(torch.float64)).abs()
    over = diff > tol.reshape(-1)
    if bool(over.any()):
        i = int(over.nonzero()[0])
        failures.append(f"{name}: {int(over.sum())} elements beyond tolerance (first at {i}: diff "
                        f"{diff[i].item():.3g} > tol {tol.reshape(-1)[i].item():.3g})")


# ---- the matrix ------------------------------------------------------------------------------------
def _group(group_ranks: Optional[list], env: Optional[dict]):
    """(hetero group, gloo group) over `group_ranks` (default all), built once with `env` set."""
    ranks = list(range(dist.get_world_size())) if group_ranks is None else list(group_ranks)
    key = ("sub", tuple(ranks), tuple(sorted((env or {}).items())))
    if key not in G:
        old = {k: os.environ.get(k) for k in (env or {})}
        os.environ.update(env or {})
        try:
            G[key] = (dist.new_group(ranks, backend="hetero"), dist.new_group(ranks, backend="gloo"))
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return G[key]


def matrix(coll: str, dtypes: list[str], ops: list[str], sizes: list[int], group_ranks: Optional[list] = None,
           seed: int = 1, env: Optional[dict] = None) -> dict:
    """Run `coll` for every dtype x op x size on the world (or a subgroup, or a group built with
    `env` settings) and check it."""
    import hal.ccl_bridge  # noqa: F401
    pg, gl = dist.group.WORLD, G["gloo"]
    if group_ranks is not None or env:
        pg, gl = _group(group_ranks, env)
        if group_ranks is not None and dist.get_rank() not in group_ranks:
            return {"checks": 0, "failures": [], "rail_mode": None}
    W = dist.get_world_size(pg)
    me = dist.get_rank(pg)
    k = len(pg.fabric.topo.subclusters) if hasattr(pg, "fabric") else 1
    failures: list[str] = []
    checks = 0
    for dn in dtypes:
        dtype = DT[dn]
        for op in ops:
            if op in ("avg",) and dtype not in FLOATS:
                continue
            if op in ("band", "bor", "bxor") and dtype in FLOATS:
                continue
            for n in sizes:
                seed += 1
                name = f"{coll} {dn} {op} n={n} W={W}"
                try:
                    checks += CASES[coll](pg, gl, W, me, k, dtype, op, n, seed, name, failures)
                except Exception as exc:  # a raise is a failure of this case, with its type
                    failures.append(f"{name}: raised {type(exc).__name__}: {exc}")
    return {"checks": checks, "failures": failures,
            "rail_mode": pg.fabric.topo.rail_mode if hasattr(pg, "fabric") else None}


def _all_inputs(seed, W, n, dtype, op):
    return torch.stack([make_input(seed, r, n, dtype, op) for r in range(W)])


def _wide(dtype):
    return torch.float64 if dtype in FLOATS else torch.int64


# The exact reference of a reduction is computed by flat gloo in float64 / int64 (exact for these
# inputs: float64 sums of W <= 4 values of 16/32-bit floats round far below the tolerance; integer
# sums and products stay inside int64 and are narrowed with wrap-around like the CCLs do). bool is
# reduced as int64 0/1 with the op that means the same thing.
_BOOL_AS = {"sum": "max", "max": "max", "bor": "max", "min": "min", "product": "min", "band": "min", "bxor": "sum"}


def _exact(x: torch.Tensor, op: str, W: int, gl, scatter: bool = False) -> torch.Tensor:
    wop = _BOOL_AS[op] if x.dtype == torch.bool else op
    w = x.to(_wide(x.dtype), copy=True)
    redop = OPS["sum" if wop == "avg" else wop]
    if scatter:  # all_reduce, then this rank's block: torch 2.5's gloo reduce_scatter ignores MAX/MIN/PRODUCT
        dist.all_reduce(w, op=redop, group=gl)
        out = w.view(W, -1)[dist.get_rank(gl)].clone()
    else:
        out = w
        dist.all_reduce(out, op=redop, group=gl)
    if wop == "avg":
        out = out / W
    if x.dtype == torch.bool:
        return (out % 2 if wop == "sum" else out).bool()
    return out if x.dtype in FLOATS else out.to(x.dtype)


def _abs_sum(x: torch.Tensor, gl, scatter: bool = False) -> torch.Tensor:
    a = x.to(torch.float64, copy=True).abs()
    W = dist.get_world_size(gl)
    if scatter:
        out = torch.empty(a.numel() // W, dtype=torch.float64)
        _RS(out, a, group=gl)
        return out
    dist.all_reduce(a, group=gl)
    return a


def tolerance(x: torch.Tensor, exact: torch.Tensor, op: str, W: int, k: int, gl, scatter: bool = False,
              wire_bf16: bool = False) -> Optional[torch.Tensor]:
    """Per-element bound on |result - exact| (docs/bridge.md, "Tolerances"): 0 for integers, bool,
    MAX and MIN; W*eps*sum|x| for SUM (W-1 roundings of partial sums bounded by sum|x|, in any order,
    plus the final one); that /W plus one rounding for AVG; W*eps*|exact| for PRODUCT; the bf16 wire
    adds k*2^-9*sum|x| (one bfloat16 rounding of each of the k sub-cluster partial sums)."""
    if x.dtype not in FLOATS or op in ("max", "min"):
        return None
    eps = torch.finfo(x.dtype).eps
    if op == "product":
        return W * eps * exact.abs()
    s = _abs_sum(x, gl, scatter)
    tol = W * eps * s
    if wire_bf16:
        tol = tol + k * 2.0 ** -9 * s
    if op == "avg":
        tol = tol / W + eps * s / W
    return tol


def _c_all_reduce(pg, gl, W, me, k, dtype, op, n, seed, name, failures):
    """all_reduce and reduce (root = last rank) on the same inputs, each vs exact and vs gloo."""
    x0 = make_input(seed, me, n, dtype, op)
    want = _exact(x0, op, W, gl)
    tol = tolerance(x0, want, op, W, k, gl, wire_bf16=pg_wire(pg))
    tol2 = None if tol is None else 2 * tol
    root = W - 1
    x = x0.clone()
    dist.all_reduce(x, op=OPS[op], group=pg)
    _cmp(name + " vs exact", x, want, tol, failures)
    r = x0.clone()
    dist.reduce(r, dst=dist.get_global_rank(pg, root), op=OPS[op], group=pg)
    if me == root:
        _cmp(name + " reduce(root=last) vs exact", r, want, tol, failures)
    checks = 2
    if _gloo_has("all_reduce", dtype, op):
        y = x0.clone()
        dist.all_reduce(y, op=OPS[op], group=gl)
        _cmp(name + " vs gloo", x, y, tol2, failures)
        checks += 1
    if _gloo_has("reduce", dtype, op) and n <= 4096:  # large: reduce runs all_reduce's code, compared above
        y = x0.clone()
        dist.reduce(y, dst=dist.get_global_rank(gl, root), op=OPS[op], group=gl)
        if me == root:
            _cmp(name + " reduce(root=last) vs gloo", r, y, tol2, failures)
        checks += 1
    return checks


def pg_wire(pg) -> bool:
    return hasattr(pg, "fabric") and pg.fabric.config.wire_dtype == "bfloat16"


def _c_reduce_scatter(pg, gl, W, me, k, dtype, op, n, seed, name, failures):
    """reduce_scatter_tensor and reduce_scatter (list); `n` is the size of the whole input tensor,
    rounded up to a multiple of W."""
    chunk = -(-n // W)
    x0 = make_input(seed, me, W * chunk, dtype, op)
    want = _exact(x0, op, W, gl, scatter=True)
    tol = tolerance(x0, want, op, W, k, gl, scatter=True)
    out = torch.empty(chunk, dtype=dtype)
    _RS(out, x0.clone(), op=OPS[op], group=pg)
    _cmp(name + " vs exact", out, want, tol, failures)
    out2 = torch.empty(chunk, dtype=dtype)
    dist.reduce_scatter(out2, list(x0.clone().chunk(W)), op=OPS[op], group=pg)
    _cmp(name + " (list) vs exact", out2, want, tol, failures)
    if _gloo_has("reduce_scatter_tensor", dtype, op):
        ref = torch.empty(chunk, dtype=dtype)
        _RS(ref, x0.clone(), op=OPS[op], group=gl)
        _cmp(name + " vs gloo", out, ref, None if tol is None else 2 * tol, failures)
        return 3
    return 2


def _c_all_gather(pg, gl, W, me, k, dtype, op, n, seed, name, failures):
    """all_gather_into_tensor and all_gather (list); `n` elements per rank."""
    stack = _all_inputs(seed, W, n, dtype, op)
    out = torch.empty(W, n, dtype=dtype)
    _AG(out, stack[me].clone(), group=pg)
    _cmp(name, out, stack, None, failures)
    outs = [torch.empty(n, dtype=dtype) for _ in range(W)]
    dist.all_gather(outs, stack[me].clone(), group=pg)
    _cmp(name + " (list)", torch.stack(outs), stack, None, failures)
    return 2


def _c_broadcast(pg, gl, W, me, k, dtype, op, n, seed, name, failures):
    checks = 0
    for root in sorted({0, W - 1, W // 2}):
        stack = _all_inputs(seed + root, W, n, dtype, op)
        x = stack[me].clone()
        dist.broadcast(x, src=dist.get_global_rank(pg, root), group=pg)
        _cmp(f"{name} root={root}", x, stack[root], None, failures)
        checks += 1
    return checks


def _splits(seed: int, W: int, n: int) -> torch.Tensor:
    """Uneven split matrix: S[i][j] = rows rank i sends to rank j (some zero); up to 64 rows per pair
    for n <= 4096, else up to n / W rows (large messages: staging buffers grow, chunks are big)."""
    g = torch.Generator().manual_seed(seed)
    hi = max(2, min(n, 64)) if n <= 4096 else n // W
    return torch.randint(0, hi, (W, W), generator=g)


def _c_all_to_all(pg, gl, W, me, k, dtype, op, n, seed, name, failures):
    """all_to_all_single and all_to_all (list) with uneven splits (rows of 3 elements, one empty)."""
    S = _splits(seed, W, n)
    S[0][W - 1] = 0
    row = 3
    ins = [make_input(seed, r, int(S[r].sum()) * row, dtype, op).view(-1, row) for r in range(W)]
    in_splits = S[me].tolist()
    out_splits = S[:, me].tolist()
    want = torch.cat([ins[r][int(S[r][:me].sum()):int(S[r][:me + 1].sum())] for r in range(W)])
    out = torch.empty(int(S[:, me].sum()), row, dtype=dtype)
    dist.all_to_all_single(out, ins[me].clone(), out_splits, in_splits, group=pg)
    _cmp(name + " single uneven", out, want, None, failures)
    outs = [torch.empty(s, row, dtype=dtype) for s in out_splits]
    dist.all_to_all(outs, list(ins[me].clone().split(in_splits)), group=pg)
    _cmp(name + " list uneven", torch.cat(outs), want, None, failures)
    return 2


def _c_gather_scatter(pg, gl, W, me, k, dtype, op, n, seed, name, failures):
    root = W - 1
    stack = _all_inputs(seed, W, n, dtype, op)
    outs = [torch.empty(n, dtype=dtype) for _ in range(W)] if me == root else None
    dist.gather(stack[me].clone(), outs, dst=dist.get_global_rank(pg, root), group=pg)
    if me == root:
        _cmp(name + " gather", torch.stack(outs), stack, None, failures)
    out = torch.empty(n, dtype=dtype)
    dist.scatter(out, list(stack.clone()) if me == 0 else None, src=dist.get_global_rank(pg, 0), group=pg)
    _cmp(name + " scatter", out, stack[me], None, failures)
    return 2


def _c_send_recv(pg, gl, W, me, k, dtype, op, n, seed, name, failures):
    stack = _all_inputs(seed, W, n, dtype, op)
    nxt, prv = (me + 1) % W, (me - 1) % W
    got = torch.empty(n, dtype=dtype)
    # ring with batch_isend_irecv (deadlock-free only if sends do not block)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, stack[me].clone(), dist.get_global_rank(pg, nxt), pg),
                                   dist.P2POp(dist.irecv, got, dist.get_global_rank(pg, prv), pg)])
    for r in reqs:
        r.wait()
    _cmp(name + " ring", got, stack[prv], None, failures)
    # plain send/recv between the first and the last rank (usually across sub-clusters)
    if me == 0:
        dist.send(stack[0].clone(), dist.get_global_rank(pg, W - 1), group=pg)
    elif me == W - 1:
        x = torch.empty(n, dtype=dtype)
        dist.recv(x, dist.get_global_rank(pg, 0), group=pg)
        _cmp(name + " 0->last", x, stack[0], None, failures)
    return 2


def a2a_accounting(group_ranks: list, seed: int = 3, n: int = 4096) -> Optional[dict]:
    """One uneven all_to_all_single on the hetero group over `group_ranks`: the elements this rank
    sent along rails (and of those, on the rails' back groups) and handed to a sub-cluster mate to
    relay (deltas of the fabric's counters),
    the cross elements it was the source of, and whether the global gloo group ever ran an
    all_to_all on this group (it must not: all_to_all takes the rails)."""
    pg = _group(group_ranks, None)[0]
    if dist.get_rank() not in group_ranks:
        return None
    W, me = dist.get_world_size(pg), dist.get_rank(pg)
    S = _splits(seed, W, n)
    x = make_input(seed, me, int(S[me].sum()), torch.float32)
    out = torch.empty(int(S[:, me].sum()))
    fx = pg.fabric
    before = dict(fx.counters)
    dist.all_to_all_single(out, x, S[:, me].tolist(), S[me].tolist(), group=pg)
    want = torch.cat([make_input(seed, r, int(S[r].sum()), torch.float32)[int(S[r][:me].sum()):int(S[r][:me + 1].sum())]
                      for r in range(W)])
    delta = {k: v - before.get(k, 0) for k, v in fx.counters.items()}
    cluster = fx.topo.cluster_of
    return {"exact": torch.equal(out, want), "rail": delta.get("a2a_rail_elems", 0),
            "rail_back": delta.get("a2a_rail_back_elems", 0), "back_groups": sorted(fx.rails_back) == sorted(fx.rails),
            "relay": delta.get("a2a_relay_elems", 0),
            "cross_source": sum(int(S[me][d]) for d in range(W) if cluster[d] != cluster[me]),
            "global_a2a": any(key[0] == "all_to_all_single" for key in fx.glob.route_counts)}


CASES = {"all_reduce+reduce": _c_all_reduce, "reduce_scatter": _c_reduce_scatter, "all_gather": _c_all_gather,
         "broadcast": _c_broadcast, "all_to_all": _c_all_to_all, "gather+scatter": _c_gather_scatter,
         "send_recv": _c_send_recv}


# ---- other properties ------------------------------------------------------------------------------
def barrier_and_async() -> dict:
    """barrier completes; async works complete in order and their futures carry the tensors."""
    pg = dist.group.WORLD
    dist.barrier()
    xs = [torch.full((1000,), float(dist.get_rank() + i)) for i in range(5)]
    works = [dist.all_reduce(x, async_op=True) for x in xs]
    fut = works[-1].get_future()
    for w in works:
        w.wait()
    W = dist.get_world_size()
    want = [sum(r + i for r in range(W)) for i in range(5)]
    return {"values": [x[0].item() for x in xs], "want": want, "future_done": fut.done(),
            "completed": all(w.is_completed() for w in works), "name": pg.group_name}


def not_supported() -> dict:
    """What torch itself does not allow raises hal.NotSupportedError (naming op and dtype) before
    anything is sent -- the group stays usable."""
    import hal
    out = {}
    for label, fn in {"avg_int64": lambda: dist.all_reduce(torch.ones(4, dtype=torch.int64), op=dist.ReduceOp.AVG),
                      "band_float": lambda: dist.all_reduce(torch.ones(4), op=dist.ReduceOp.BAND)}.items():
        try:
            fn()
            out[label] = "no error"
        except hal.NotSupportedError as exc:
            out[label] = f"NotSupportedError: {exc}"
    x = torch.ones(4)
    dist.all_reduce(x)
    out["after"] = x.tolist()
    return out


def premul_sum(n: int) -> list:
    x = make_input(5, dist.get_rank(), n, torch.float32)
    dist.all_reduce(x, op=compat.premul_sum(0.25))  # not callable on torch 2.5
    W = dist.get_world_size()
    want = sum(make_input(5, r, n, torch.float32).double() * 0.25 for r in range(W))
    return [(x.double() - want).abs().max().item(), (W + 1) * torch.finfo(torch.float32).eps *
            sum(make_input(5, r, n, torch.float32).double().abs() * 0.25 for r in range(W)).max().item()]


def staging_reuse(n: int) -> dict:
    """After one warm-up call, repeated rail-path all_reduce and reduce_scatter allocate nothing."""
    pg = dist.group.WORLD
    x = torch.ones(n)
    dist.all_reduce(x)
    out = torch.empty(n)
    _RS(out, torch.ones(n * dist.get_world_size()))
    before = pg.fabric.scratch.allocations
    for _ in range(3):
        dist.all_reduce(x)
        _RS(out, torch.ones(n * dist.get_world_size()))
    return {"before": before, "after": pg.fabric.scratch.allocations, "value": x[0].item(), "rs": out[0].item()}


def routes(group_ranks: Optional[list] = None) -> Optional[dict]:
    """Which emulation routes this rank's sub-cluster CCL took in the group over `group_ranks`
    (e.g. Kunlun's MAX via gather_reduce)."""
    pg = _group(group_ranks, None)[0] if group_ranks is not None else dist.group.WORLD
    if group_ranks is not None and dist.get_rank() not in group_ranks:
        return None
    from hal.contract.capabilities import dtype_name
    return {f"{c} {dtype_name(d)} {o or '-'}": r for (c, d, o), r in pg.fabric.intra._routes.items() if r != "native"}


def wire_bf16(n: int) -> dict:
    """A subgroup built with HAL_BRIDGE_WIRE_DTYPE=bf16: float32 SUM within the documented bound, and
    the same bits on every rank."""
    os.environ["HAL_BRIDGE_WIRE_DTYPE"] = "bf16"
    try:
        pg = dist.new_group(list(range(dist.get_world_size())), backend="hetero")
    finally:
        os.environ.pop("HAL_BRIDGE_WIRE_DTYPE")
    failures: list = []
    W = dist.get_world_size()
    k = len(pg.fabric.topo.subclusters)
    checks = 0
    for size in (7, n):
        stack = _all_inputs(77 + size, W, size, torch.float32, "sum")
        x = stack[dist.get_rank()].clone()
        dist.all_reduce(x, group=pg)
        x0 = stack[dist.get_rank()]
        want = _exact(x0, "sum", W, G["gloo"])
        _cmp(f"wire bf16 n={size}", x, want, tolerance(x0, want, "sum", W, k, G["gloo"], wire_bf16=True), failures)
        allx = torch.empty(W * size)
        _AG(allx, x, group=G["gloo"])
        allx = allx.view(W, size)
        if not all(torch.equal(allx[0], allx[r]) for r in range(W)):
            failures.append(f"wire bf16 n={size}: ranks hold different results")
        checks += 2
    return {"checks": checks, "failures": failures, "wire": pg.fabric.config.wire_dtype}


def debug_mismatch() -> dict:
    """HAL_BRIDGE_DEBUG=1 group: rank 0 passes shape (4,), the others (5,): every rank raises
    BridgeMismatchError naming each rank's shape; then a matching call still works."""
    import hal.ccl_bridge
    os.environ["HAL_BRIDGE_DEBUG"] = "1"
    try:
        pg = dist.new_group(list(range(dist.get_world_size())), backend="hetero")
    finally:
        os.environ.pop("HAL_BRIDGE_DEBUG")
    x = torch.ones(4 if dist.get_rank() == 0 else 5)
    out = {"debug": pg.fabric.config.debug}
    try:
        dist.all_reduce(x, group=pg)
        out["error"] = None
    except hal.ccl_bridge.BridgeMismatchError as exc:
        out["error"] = str(exc)
        out["seq"] = exc.seq
    y = torch.ones(6)
    dist.all_reduce(y, group=pg)
    out["after"] = y[0].item()
    return out


def config_disagreement() -> str:
    """Ranks with different HAL_BRIDGE_SMALL_BYTES: group creation raises BridgeConfigError on all."""
    import hal.ccl_bridge
    os.environ["HAL_BRIDGE_SMALL_BYTES"] = str(1000 + dist.get_rank())
    try:
        dist.new_group(list(range(dist.get_world_size())), backend="hetero")
        return "no error"
    except hal.ccl_bridge.BridgeConfigError as exc:
        return f"BridgeConfigError: {exc}"
    finally:
        os.environ.pop("HAL_BRIDGE_SMALL_BYTES")


def subgroup_kinds(ranks: list) -> Optional[tuple]:
    """Type of a hetero subgroup over `ranks` (pass-through when they share one chip)."""
    key = ("kind", tuple(ranks))
    if key not in G:
        G[key] = dist.new_group(ranks, backend="hetero")
    pg = G[key]
    if dist.get_rank() not in ranks:
        return None
    t = torch.ones(2) * (dist.get_rank() + 1)
    dist.all_reduce(t, group=pg)
    return type(pg).__name__, t.tolist()


# ---- faults ------------------------------------------------------------------------------------------
def fault(point: str, action: str, victim: int, n: int, timeout_s: float, freeze_s: float = 0.0,
          op: str = "all_reduce", grace_s: Optional[float] = None) -> dict:
    """On a fresh hetero group with `timeout_s`, rank `victim` dies or freezes at `point` inside its
    second collective (#1, an all_reduce or an all_to_all_single of `n` elements per rank); every
    rank reports the error it raised and how long the call took. A frozen victim also queues a
    third collective (#2) behind the frozen one: its waiter must give up as soon as the first one's
    waiter has broken the group. `grace_s` sets HAL_BRIDGE_GRACE_S for this group only."""
    import hal.ccl_bridge
    from hal.ccl_bridge import faults
    W = dist.get_world_size()
    if grace_s is not None:
        os.environ["HAL_BRIDGE_GRACE_S"] = str(grace_s)
    try:
        pg = dist.new_group(list(range(W)), backend="hetero", timeout=datetime.timedelta(seconds=timeout_s))
    finally:
        if grace_s is not None:
            os.environ.pop("HAL_BRIDGE_GRACE_S")
    x = torch.ones(n)

    def collective(t, async_op=False):
        if op == "all_to_all":
            return dist.all_to_all_single(torch.empty_like(t), t, group=pg, async_op=async_op)
        return dist.all_reduce(t, group=pg, async_op=async_op)
    collective(x)  # a healthy collective first (#0)
    if dist.get_rank() == victim:
        faults.arm(point, action, seconds=freeze_s)
    t0 = time.monotonic()
    try:
        if dist.get_rank() == victim and action == "freeze":
            w1 = collective(x, async_op=True)
            w2 = collective(x.clone(), async_op=True)
            try:
                w1.wait()
            finally:
                t1 = time.monotonic()
                try:
                    w2.wait()
                    G["queued"] = {"error": None}
                except hal.ccl_bridge.BridgeCollectiveError as exc:
                    G["queued"] = {"type": type(exc).__name__, "seq": exc.seq, "error": str(exc),
                                   "seconds": time.monotonic() - t1}
        else:
            collective(x)
        return {"error": None, "seconds": time.monotonic() - t0}
    except hal.ccl_bridge.BridgeCollectiveError as exc:
        from hal.contract.errors import CollectivePeerError, CollectiveTimeoutError
        return {"error": f"{type(exc).__name__}: {exc}", "type": type(exc).__name__, "op": exc.op, "seq": exc.seq,
                "seconds": time.monotonic() - t0, "queued": G.pop("queued", None),
                "hal_base": [c.__name__ for c in (CollectivePeerError, CollectiveTimeoutError) if isinstance(exc, c)]}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "type": type(exc).__name__, "seconds": time.monotonic() - t0}
    finally:
        faults.disarm()
