"""The shared-memory fabric (hal.emulation.shm) against gloo: correctness matrix, faults, /dev/shm, selection.

One module-scoped WorkerPool per rank count (2, 3, 4). On every rank the `shm` group and a gloo
group run the same call on the same inputs; integers, bool, MAX/MIN and every data-moving
collective must match gloo bit for bit; float SUM/AVG/PRODUCT within FLOAT_RTOL x n x the largest
possible sum (or product) of magnitudes: shm accumulates float16/bfloat16 in float32 and rounds
once, gloo rounds at every step, so they legitimately differ by a few half-precision ulps. Where
gloo refuses a combination (int16 everywhere; uneven list all_to_all), the reference is computed
from every rank's regenerated input. AVG on integers/bool must be refused (gloo refuses it too).
Every reduction is also checked bit for bit against the exact rank-order reference (shm reduces in
rank order on every rank, so its result is fully determined). Sizes {1, 7, 4096, 1000003, one
larger than the whole segment}: the full product on 2 ranks; on 3 and 4 ranks the full product at
the small sizes and one dtype per element size at the large ones (see test_matrix_against_gloo;
this keeps the module near its time budget on 2 cores). The groups
use a 256 KiB slot, so the two large sizes run in many chunks. Worker-side functions live in this
module (the pool imports it by name).
"""
from __future__ import annotations

import os
import signal
import time
from datetime import timedelta
from functools import lru_cache

import pytest
import torch
import torch.distributed as dist

from hal.contract.capabilities import DTYPES, TORCH_REDUCE_OPS, torch_dtype
from hal.testing import WorkerPool

DT = {n: torch_dtype(n) for n in DTYPES if not n.startswith("float8")}  # hal's name table, float8 aside
FLOATS = ("float32", "float16", "bfloat16", "float64")
INTS = ("int8", "uint8", "int16", "int32", "int64")
OPS = TORCH_REDUCE_OPS  # hal's reduce-op name table
# |shm - gloo| <= rtol * n * sum_r |x_r| (+ the same bound on the float64 reference): a few roundings.
FLOAT_RTOL = {"float32": 2.0 ** -22, "float64": 2.0 ** -51, "float16": 2.0 ** -9, "bfloat16": 2.0 ** -7}
SLOT_BYTES = 256 << 10
P2P_SLOT_BYTES = 16 << 10
REDUCING = ("all_reduce", "reduce_scatter", "reduce_scatter_tensor")
MOVING = ("broadcast", "all_gather", "all_gather_into_tensor", "all_to_all", "all_to_all_single", "send_recv")

# ======================================= worker side ===========================================
G: dict = {}


def _store(prefix: str):
    if "store" not in G:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        G["store"] = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, rank == 0,
                                   timeout=timedelta(seconds=60))
    return dist.PrefixStore(prefix, G["store"])


def _groups(timeout_s: float = 60.0):
    if "shm" not in G:
        from hal.emulation.shm import create_shm_process_group
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        G["shm"] = create_shm_process_group(_store("matrix_shm"), rank, world, timedelta(seconds=timeout_s),
                                            slot_bytes=SLOT_BYTES, p2p_slot_bytes=P2P_SLOT_BYTES)
        G["gloo"] = dist.ProcessGroupGloo(_store("matrix_gloo"), rank, world, timedelta(seconds=timeout_s))
    return G["shm"], G["gloo"]


def setup() -> dict:
    shm, _ = _groups()
    names = sorted(os.listdir("/dev/shm"))
    return {"pid": os.getpid(), "segment_bytes": shm.segment_bytes, "backend": shm.name(),
            "dev_shm": [n for n in names if n.startswith("hal-shm-")]}


@lru_cache(maxsize=48)
def _input(dname: str, op: str, numel: int, rank: int) -> torch.Tensor:
    """Deterministic, rank-dependent values in ranges where no op overflows differently. Cached
    (the matrix reuses one input per dtype x size across ops and collectives): never modify the
    result in place. Large inputs are rank 0's pattern rotated per rank (one cheap pass)."""
    kind = "product" if op == "product" else "plain"
    if kind != op:
        return _input(dname, kind, numel, rank)
    if numel > 65536 and rank > 0:
        return _input(dname, kind, numel, 0).roll(rank * 7919)
    i = torch.arange(numel, dtype=torch.int32)
    mix = (i * 40503 + (rank + 1) * 9973) % 20011  # int32 wrap-around is deterministic too
    if dname == "bool":
        return (mix % 3 == 0)
    if dname in FLOATS:
        if op == "product":  # near 1, so 4 ranks' product stays in range in float16
            x = 0.75 + (mix % 512).to(torch.float32) / 1024
        else:  # in [-100, 106.3]; multiples of 1/97, so not exactly representable: real rounding
            x = mix.to(torch.float64) / 97.0 - 100.0
        return x.to(DT[dname])
    if op == "product":
        lo, hi = (0, 4) if dname == "uint8" else (-3, 4)
    else:
        lo, hi = (0, 60) if dname == "uint8" else (-30, 31)
    return (lo + mix % (hi - lo)).to(DT[dname])


def _float_scale(op: str, n: int) -> float:
    """Largest possible sum of |x_r| (SUM/AVG) or product of |x_r| (PRODUCT) over n ranks."""
    return 1.25 ** n if op == "product" else 106.3 * n


def _close(a: torch.Tensor, b: torch.Tensor, dname: str, op: str, scale: float, n: int) -> str:
    """'' if a matches b by the module's rule, else a short description of the worst element."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"shape/dtype {tuple(a.shape)}/{a.dtype} vs {tuple(b.shape)}/{b.dtype}"
    exact = dname not in FLOATS or op in ("max", "min", "-")
    if exact:
        if torch.equal(a, b):
            return ""
        bad = (a != b).nonzero()[0].item() if a.numel() else 0
        return f"not bit-exact at [{bad}]: {a.view(-1)[bad].item()} vs {b.view(-1)[bad].item()}"
    diff = (a.double() - b.double()).abs()
    bound = torch.tensor(FLOAT_RTOL[dname] * n * scale, dtype=torch.float64).expand_as(diff)
    if bool((diff <= bound).all()):
        return ""
    worst = int((diff - bound).argmax())
    return f"|diff| {diff.view(-1)[worst].item():.3g} > bound {bound.view(-1)[worst].item():.3g} at [{worst}]"


_FOLD = {"sum": torch.add, "avg": torch.add, "product": torch.mul, "max": torch.maximum, "min": torch.minimum,
         "band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}


def _exact(xs: list, op: str, dname: str) -> torch.Tensor:
    """What shm must produce, bit for bit: the fold in rank order, float16/bfloat16 in float32 with
    one final rounding, AVG = sum / n in the accumulation type, integers wrapping (int64 fold, then
    cast), bool as logical any/all/xor."""
    if dname == "bool":
        ys = [x.to(torch.int64) for x in xs]
        f = {"sum": torch.maximum, "max": torch.maximum, "bor": torch.maximum, "product": torch.minimum,
             "min": torch.minimum, "band": torch.minimum, "bxor": torch.bitwise_xor}[op]
    else:
        acc_t = torch.float32 if dname in ("float16", "bfloat16") else (DT[dname] if dname in FLOATS else torch.int64)
        ys, f = [x.to(acc_t) for x in xs], _FOLD[op]
    acc = ys[0]
    for y in ys[1:]:
        acc = f(acc, y)
    if op == "avg":
        acc = acc / len(xs)
    return acc.to(DT[dname])


def _opts(cls, op: str):
    o = cls()
    o.reduceOp = OPS[op]
    return o


def _ops_for(dname: str) -> list:
    if dname in FLOATS:
        return ["sum", "avg", "max", "min", "product"]
    return ["sum", "avg", "max", "min", "product", "band", "bor", "bxor"]


def _reducing_case(shm, gloo, coll: str, dname: str, op: str, numel: int, with_gloo: bool) -> str:
    rank, n = shm.rank(), shm.size()
    dtype = DT[dname]
    if coll == "all_reduce":
        make = lambda r: _input(dname, op, numel, r)  # noqa: E731
    else:  # size = each rank's input (as nccl-tests counts): n blocks, rank r receives block r
        numel = -(-numel // n)
        make = lambda r: _input(dname, op, n * numel, r)  # noqa: E731
    x = make(rank)

    def run(pg):
        if coll == "all_reduce":
            y = x.clone()
            pg.allreduce([y], _opts(dist.AllreduceOptions, op)).wait()
            return y
        out = torch.empty(numel, dtype=dtype)
        if coll == "reduce_scatter":
            pg.reduce_scatter([out], [list(x.chunk(n))], _opts(dist.ReduceScatterOptions, op)).wait()
        else:
            pg._reduce_scatter_base(out, x, _opts(dist.ReduceScatterOptions, op)).wait()
        return out

    if op == "avg" and dname not in FLOATS:
        from hal.emulation.shm import ShmUnsupportedError
        try:
            run(shm)
        except ShmUnsupportedError:
            return ""
        return "AVG on an integer dtype was not refused"
    got = run(shm)
    exact = _exact([make(r) for r in range(n)], op, dname)
    if coll != "all_reduce":
        exact = exact.chunk(n)[rank]
    err = _close(got, exact, dname, "-", 0.0, n)
    if err:
        return "vs the exact rank-order reference: " + err
    if with_gloo and dname != "int16":  # gloo refuses int16
        err = _close(got, run(gloo), dname, op, _float_scale(op, n), n)
        return "vs gloo: " + err if err else ""
    return ""


def _split_sizes(numel: int, n: int, src: int) -> list:
    """Uneven: rank `src` sends numel + ((src + 2 * dst) % 3) elements to rank dst (none if numel is 0)."""
    return [numel + (src + 2 * dst) % 3 if numel else 0 for dst in range(n)]


def _moving_case(shm, gloo, coll: str, dname: str, numel: int, with_gloo: bool) -> str:
    rank, n = shm.rank(), shm.size()
    dtype = DT[dname]
    gloo_ok = dname not in ("int16",)

    if coll in ("all_gather", "all_gather_into_tensor", "all_to_all", "all_to_all_single"):
        numel = -(-numel // n)  # size = the gathered (or exchanged) total, as nccl-tests counts it

    def local(r):
        return _input(dname, "sum", numel, r)

    if coll == "send_recv":  # ring: isend to the next rank and irecv from the previous, then wait
        if n < 2:
            return ""
        nxt, prv = (rank + 1) % n, (rank - 1) % n
        y = torch.empty(numel, dtype=dtype)
        w1 = shm.send([local(rank)], nxt, 7)
        w2 = shm.recv([y], prv, 7)
        w1.wait()
        w2.wait()
        return _close(y, local(prv), dname, "-", None, n)

    def run(pg):
        x = local(rank).clone()
        if coll == "broadcast":
            o = dist.BroadcastOptions()
            o.rootRank = n - 1
            pg.broadcast([x], o).wait()
            return [x]
        if coll == "all_gather":
            outs = [torch.empty(numel, dtype=dtype) for _ in range(n)]
            pg.allgather([outs], [x]).wait()
            return outs
        if coll == "all_gather_into_tensor":
            out = torch.empty(n * numel, dtype=dtype)
            pg._allgather_base(out, x).wait()
            return [out]
        sizes_in = _split_sizes(numel, n, rank)
        sizes_out = [_split_sizes(numel, n, q)[rank] for q in range(n)]
        xin = _input(dname, "sum", sum(sizes_in), rank)
        if coll == "all_to_all":
            outs = [torch.empty(s, dtype=dtype) for s in sizes_out]
            pg.alltoall(outs, list(xin.split(sizes_in)), dist.AllToAllOptions()).wait()
            return outs
        out = torch.empty(sum(sizes_out), dtype=dtype)
        pg.alltoall_base(out, xin, sizes_out, sizes_in, dist.AllToAllOptions()).wait()
        return [out]

    got = run(shm)
    if coll == "broadcast":  # the exact expectation, from every rank's regenerated input
        want = [local(n - 1)]
    elif coll in ("all_gather", "all_gather_into_tensor"):
        want = [local(r) for r in range(n)]
        want = want if coll == "all_gather" else [torch.cat(want)]
    else:
        parts = [_input(dname, "sum", sum(_split_sizes(numel, n, q)), q).split(_split_sizes(numel, n, q))[rank]
                 for q in range(n)]
        want = parts if coll == "all_to_all" else [torch.cat(parts)]
    refs = [("the exact expectation", want)]
    if with_gloo and gloo_ok and coll != "all_to_all":  # gloo's list all_to_all refuses uneven sizes
        refs.append(("gloo", run(gloo)))
    for what, ref in refs:
        if len(got) != len(ref):
            return f"{len(got)} outputs vs {len(ref)} from {what}"
        for g, w in zip(got, ref):
            err = _close(g, w, dname, "-", None, n)
            if err:
                return f"vs {what}: {err}"
    return ""


def matrix(colls: list, sizes: list, dtypes: list, only_ops: list | None = None, gloo_sizes: list | None = None) -> dict:
    """Every coll x dtype x op x size on this rank (ops limited to `only_ops` if given); returns
    the number of checks made and the failures. Against gloo too at `gloo_sizes` (default: all)."""
    shm, gloo = _groups()
    large = shm.segment_bytes  # bytes: "one larger than the segment"
    failures, checks = [], 0
    for dname in dtypes:  # dtype, then size outermost: the cached inputs serve every coll x op
        esize = torch.empty(0, dtype=DT[dname]).element_size()
        for size in sizes:
            numel = large // esize + 13 if size == "large" else size
            for coll in colls:
                ops = [o for o in _ops_for(dname) if only_ops is None or o in only_ops]
                for op in (ops if coll in REDUCING else ["-"]):
                    try:
                        with_gloo = gloo_sizes is None or size in gloo_sizes
                        err = (_reducing_case(shm, gloo, coll, dname, op, numel, with_gloo) if coll in REDUCING
                               else _moving_case(shm, gloo, coll, dname, numel, with_gloo))
                    except Exception as exc:  # report, keep the ranks in step (every rank raises alike)
                        err = f"{type(exc).__name__}: {exc}"
                    checks += 1
                    if err:
                        failures.append(f"{coll} {dname} op={op} numel={numel}: {err}")
    shm.barrier().wait()
    return {"checks": checks, "failures": failures}


def barrier_and_fallbacks() -> list:
    """barrier, and the explicit gloo fallbacks (gather, scatter, reduce) on the shm group."""
    shm, _ = _groups()
    rank, n = shm.rank(), shm.size()
    shm.barrier().wait()
    x = torch.full((5,), float(rank))
    o = dist.ReduceOptions()
    o.rootRank, o.reduceOp = 0, dist.ReduceOp.SUM
    y = x.clone()
    shm.reduce([y], o).wait()
    g = dist.GatherOptions()
    g.rootRank = 0
    outs = [[torch.empty(5) for _ in range(n)]] if rank == 0 else []
    shm.gather(outs, [x], g).wait()
    s = dist.ScatterOptions()
    s.rootRank = 0
    got = torch.empty(5)
    shm.scatter([got], [[torch.full((5,), float(r * 10)) for r in range(n)]] if rank == 0 else [], s).wait()
    shm.barrier().wait()
    return [float(y[0]) if rank == 0 else None, [float(t[0]) for t in outs[0]] if rank == 0 else None,
            float(got[0])]


def kill_peer(victim: int) -> dict:
    """The victim dies (SIGKILL) instead of calling all_reduce; survivors report what they raised."""
    shm, _ = _groups()
    rank = shm.rank()
    shm.barrier().wait()
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        shm.allreduce([torch.ones(1000)]).wait()
        first = None
    except Exception as exc:
        first = exc
    took = time.monotonic() - t0
    try:  # the group is broken for good: the next call raises at once
        shm.barrier().wait()
        second = None
    except Exception as exc:
        second = exc
    from hal.contract.errors import CollectivePeerError
    return {"type": type(first).__name__, "peer": getattr(first, "peer", None), "op": getattr(first, "op", None),
            "seq": getattr(first, "seq", None), "msg": str(first), "seconds": took,
            "second": type(second).__name__, "second_msg": str(second),
            "peer_error": [isinstance(e, CollectivePeerError) for e in (first, second)]}


def stalled_peer(timeout_s: float) -> dict:
    """Rank 1 does not call the collective: rank 0 raises a timeout naming it; rank 1's later call
    finds the group aborted. A fresh group with a short timeout (the matrix group stays usable)."""
    from hal.emulation.shm import create_shm_process_group
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    G["stalls"] = G.get("stalls", 0) + 1  # same count on every rank: a fresh store prefix per call
    pg = create_shm_process_group(_store(f"stall{G['stalls']}"), rank, world, timedelta(seconds=timeout_s))
    pg.barrier().wait()
    out = {}
    try:
        if rank == 1:
            time.sleep(timeout_s * 2.5)
        pg.allreduce([torch.ones(10)]).wait()
        out["first"] = None
    except Exception as exc:
        out.update(first=type(exc).__name__, peer=getattr(exc, "peer", None), op=getattr(exc, "op", None),
                   seq=getattr(exc, "seq", None), msg=str(exc))
    pg.shutdown()
    return out


def unmatched_recv(timeout_s: float) -> dict:
    """Rank 0 waits for a message rank 1 never sends: a typed timeout naming recv, peer and tag."""
    from hal.emulation.shm import create_shm_process_group
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    pg = create_shm_process_group(_store("unmatched"), rank, world, timedelta(seconds=timeout_s))
    out = {"type": None}
    if rank == 0:
        try:
            pg.recv([torch.empty(100)], 1, 5).wait()
        except Exception as exc:
            out = {"type": type(exc).__name__, "msg": str(exc), "op": getattr(exc, "op", None),
                   "peer": getattr(exc, "peer", None)}
    time.sleep(0.2 if rank == 0 else timeout_s * 1.5)
    pg.shutdown()
    return out


def mismatched_calls() -> dict:
    """Ranks disagree on the element count: every rank raises ShmMismatchError before moving data."""
    from hal.emulation.shm import create_shm_process_group
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    pg = create_shm_process_group(_store("mismatch"), rank, world, timedelta(seconds=20))
    try:
        pg.allreduce([torch.ones(10 + rank)]).wait()
        return {"type": None}
    except Exception as exc:
        return {"type": type(exc).__name__, "msg": str(exc), "seq": getattr(exc, "seq", None)}
    finally:
        pg.shutdown()


def selection(mode: str, fake_other_host_rank: int) -> dict:
    """create_cpu_process_group under HAL_CPU_CCL=mode; one rank may pretend to be on another host."""
    import hal.emulation.shm.host as host
    from hal.emulation.emulate import create_cpu_process_group
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    real = host.host_identity
    if rank == fake_other_host_rank:
        host.host_identity = lambda: {**real(), "hostname": "elsewhere", "boot_id": "another-kernel"}
    os.environ["HAL_CPU_CCL"] = mode
    try:
        pg = create_cpu_process_group(_store(f"sel_{mode}_{fake_other_host_rank}"), rank, world,
                                      timedelta(seconds=20))
        t = torch.tensor([float(rank + 1)])
        pg.allreduce([t]).wait()
        out = {"backend": pg.name(), "sum": t.item()}
        if hasattr(pg, "shutdown") and pg.name() == "shm":
            pg.shutdown()
        return out
    except Exception as exc:
        return {"error": type(exc).__name__, "msg": str(exc)}
    finally:
        host.host_identity = real
        os.environ.pop("HAL_CPU_CCL", None)


def torch_api_and_ddp() -> dict:
    """dist.init_process_group("shm") and torch's own callers: dist.* collectives, new_group, DDP."""
    import hal.emulation.shm  # noqa: F401  (registers the backend name)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("shm", store=_store("init"), rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))
    try:
        out = {"backend": dist.get_backend()}
        t = torch.tensor([float(rank)])
        dist.all_reduce(t)
        out["all_reduce"] = t.item()
        g = torch.empty(world)
        dist.all_gather_into_tensor(g, torch.tensor([float(rank)]))
        out["all_gather"] = g.tolist()
        r = torch.empty(1)
        dist.reduce_scatter_tensor(r, torch.arange(world, dtype=torch.float32) + rank)
        out["reduce_scatter"] = r.item()
        sub = dist.new_group([0, 1], backend="shm")
        if rank in (0, 1):
            s = torch.tensor([1.0])
            dist.all_reduce(s, group=sub)
            out["sub"] = s.item()
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        ddp(torch.full((3, 4), float(rank + 1))).sum().backward()
        out["grad"] = model.weight.grad[0, 0].item()
        return out
    finally:
        dist.destroy_process_group()


def dev_shm_names() -> list:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith("hal-shm-"))


# ======================================= test side =============================================
SMALL_SIZES = [1, 7, 4096]
LARGE_SIZES = [1000003, "large"]  # "large": more bytes than the whole segment
SIZES = SMALL_SIZES + LARGE_SIZES
LARGE_DTYPES = ["int8", "bfloat16", "float32", "int64"]  # element sizes 1, 2, 4, 8


@pytest.fixture(scope="module", params=[2, 3, 4])
def pool(request):
    with WorkerPool(request.param) as p:
        p.info = p.run(setup, timeout=120)
        p.n = request.param
        yield p


def _ours(names: list, pids: list) -> list:
    return [n for n in names if any(n.startswith(f"hal-shm-{pid}-") for pid in pids)]


def test_segment_name_gone_once_created(pool):
    # rank 0 created the segment; every rank mapped it; its name must already be gone from /dev/shm
    pids = [i["pid"] for i in pool.info]
    assert all(i["backend"] == "shm" for i in pool.info)
    assert _ours(sorted(os.listdir("/dev/shm")), pids) == []
    assert all(_ours(i["dev_shm"], pids) == [] for i in pool.info)


def _matrix(pool, colls, sizes, dtypes, only_ops=None, gloo_sizes=None) -> int:
    results = pool.run(matrix, list(colls), sizes, list(dtypes), only_ops, gloo_sizes, timeout=400)
    failures = [f"rank {r}: {f}" for r, res in enumerate(results) for f in res["failures"]]
    assert not failures, f"{pool.n} ranks: {len(failures)} failures:\n" + "\n".join(failures[:20])
    return results[0]["checks"]


@pytest.mark.parametrize("colls", [REDUCING, MOVING])
def test_matrix_against_gloo(pool, colls):
    """Every case is checked bit for bit against the exact rank-order reference and, where gloo
    supports it, against gloo. 2 ranks: the full product at every size, all against gloo. 3 and 4
    ranks (where gloo is slow on 2 cores): the full product at sizes 1, 7, 4096, against gloo at
    4096; at the two large sizes one dtype per element size with SUM, against gloo (the large-size
    paths depend on rank count and element size, not on the op, whose kernel the small sizes and
    the 2-rank run cover at every size)."""
    def cells(dtypes, ops=None):
        if colls == MOVING:
            return len(dtypes) * len(MOVING)
        return 3 * sum(len([o for o in _ops_for(d) if ops is None or o in ops]) for d in dtypes)

    if pool.n == 2:
        assert _matrix(pool, colls, SIZES, DT) == cells(DT) * len(SIZES)
    else:
        assert _matrix(pool, colls, SMALL_SIZES, DT, gloo_sizes=[4096]) == cells(DT) * len(SMALL_SIZES)
        assert _matrix(pool, colls, LARGE_SIZES, LARGE_DTYPES, ["sum"]) == cells(LARGE_DTYPES, ["sum"]) * 2


def test_barrier_and_gloo_fallbacks(pool):
    n = pool.n
    out = pool.run(barrier_and_fallbacks, timeout=60)
    assert out[0][0] == sum(range(n))                      # reduce (gloo fallback) at root 0
    assert out[0][1] == [float(r) for r in range(n)]       # gather
    assert [o[2] for o in out] == [float(r * 10) for r in range(n)]  # scatter


def test_empty_tensors(pool):
    if pool.n != 2:
        pytest.skip("one rank count is enough for empty tensors")
    assert _matrix(pool, REDUCING + MOVING, [0], ["float32", "int64"], ["sum", "max"]) == 2 * (3 * 2 + 6)


def test_errors_are_typed(pool):
    if pool.n != 2:
        pytest.skip("one rank count is enough for the error paths")
    out = pool.run(mismatched_calls, timeout=60)
    # the rank that compares first raises ShmMismatchError and aborts the group; the other raises the same, or,
    # when the abort reaches it before its own comparison (seen once in CI, 2026-11-27), ShmAbortedError whose
    # message carries the mismatch ("for the reason in the message", errors.py): both name the two calls
    assert "ShmMismatchError" in [o["type"] for o in out], out
    for o in out:
        assert o["type"] in ("ShmMismatchError", "ShmAbortedError"), out
        assert "all_reduce" in o["msg"] and "count 10" in o["msg"] and "count 11" in o["msg"], out
    out = pool.run(stalled_peer, 1.0, timeout=60)
    assert out[0]["first"] == "ShmTimeoutError" and out[0]["peer"] == 1 and out[0]["op"] == "all_reduce", out
    assert "rank 1 did not arrive within 1.0 s" in out[0]["msg"]
    assert out[1]["first"] == "ShmAbortedError" and "did not arrive" in out[1]["msg"], out
    out = pool.run(unmatched_recv, 1.0, timeout=60)
    assert out[0]["type"] == "ShmTimeoutError" and out[0]["op"] == "recv" and out[0]["peer"] == 1, out
    assert "recv from rank 1 (tag 5" in out[0]["msg"] and "no progress within 1.0 s" in out[0]["msg"], out


def test_selection(pool):
    if pool.n != 3:
        pytest.skip("one rank count is enough for the selection rule")
    auto = pool.run(selection, "auto", -1, timeout=60)
    assert [o.get("backend") for o in auto] == ["shm"] * 3 and auto[0]["sum"] == 6.0, auto
    forced_gloo = pool.run(selection, "gloo", -1, timeout=60)
    assert [o.get("backend") for o in forced_gloo] == ["gloo"] * 3
    split = pool.run(selection, "auto", 2, timeout=60)  # rank 2 "elsewhere": gloo for everyone
    assert [o.get("backend") for o in split] == ["gloo"] * 3 and split[1]["sum"] == 6.0, split
    forced = pool.run(selection, "shm", 2, timeout=60)
    assert [o.get("error") for o in forced] == ["ShmSetupError"] * 3, forced
    assert "elsewhere" in forced[0]["msg"] and "ranks [2]" in forced[0]["msg"]


def test_torch_api_and_ddp(pool):
    if pool.n != 2:
        pytest.skip("one rank count is enough for torch's own callers")
    out = pool.run(torch_api_and_ddp, timeout=90)
    assert [o["backend"] for o in out] == ["shm", "shm"]
    assert [o["all_reduce"] for o in out] == [1.0, 1.0]
    assert out[0]["all_gather"] == [0.0, 1.0] and [o["reduce_scatter"] for o in out] == [1.0, 3.0]
    assert [o["sub"] for o in out] == [2.0, 2.0]
    # DDP averages the gradient: d(sum(Wx))/dW00 = 3 rows x (rank + 1) -> mean over ranks of 3, 6
    assert [o["grad"] for o in out] == [4.5, 4.5]


def test_killed_peer_raises_and_leaves_nothing(pool):
    """Last test of each pool: it kills a worker."""
    if pool.n != 3:
        pytest.skip("one rank count is enough for a kill")
    pids = [i["pid"] for i in pool.info]
    out = pool.run(kill_peer, 1, timeout=120, check=False)
    assert out[1].died
    for r in (0, 2):
        o = out[r].value
        assert o["type"] == "ShmPeerDiedError", o
        assert o["peer"] == 1 and o["op"] == "all_reduce" and o["seq"] is not None, o
        assert "rank 1 (pid" in o["msg"] and "died" in o["msg"]
        assert o["second"] in ("ShmPeerDiedError", "ShmAbortedError"), o
        assert o["peer_error"] == [True, True], o    # hal.contract.errors.CollectivePeerError, as the bridge's
    assert _ours(sorted(os.listdir("/dev/shm")), pids) == []


def test_reduce_kernel_rounding_matches_torch():
    """The C++ kernel alone (no processes): float16/bfloat16 accumulate in float32 and round once
    to nearest even, i.e. exactly torch's `(a.float() + b.float()).to(dtype)`, subnormals included;
    MAX propagates NaN as torch.maximum does."""
    from hal.emulation.shm import _shm
    from hal.emulation.shm.process_group import DTYPE_CODES, REDOP_CODES
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16):
        a = (torch.randn(10007, generator=g) * 2.0 ** torch.randint(-30, 12, (10007,), generator=g)).to(dtype)
        b = (torch.randn(10007, generator=g) * 2.0 ** torch.randint(-30, 12, (10007,), generator=g)).to(dtype)
        a[::97], b[::89], a[::53], b[::53], a[5::61], b[7::61] = float("nan"), float("nan"), 0.0, -0.0, -0.0, 0.0
        for name, fn in (("SUM", torch.add), ("MAX", torch.maximum), ("PRODUCT", torch.mul)):
            out = torch.empty_like(a)
            _shm.reduce(out.data_ptr(), [a.data_ptr(), b.data_ptr()], a.numel(), DTYPE_CODES[dtype],
                        REDOP_CODES[getattr(dist.ReduceOp.RedOpType, name)])
            want = fn(a.float(), b.float()).to(dtype)
            same = (out.view(torch.int16) == want.view(torch.int16)) | (out.isnan() & want.isnan())
            if name == "MAX":  # +0 vs -0: torch itself answers either (scalar vs vector path)
                same |= (a == 0) & (b == 0) & (out == 0)
            assert bool(same.all()), (dtype, name, int((~same).sum()))
