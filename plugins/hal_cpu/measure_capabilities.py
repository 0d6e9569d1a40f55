"""Measure which collective x dtype x reduce op the CPU fabric really supports, and write the matrix.

    python -m hal_cpu.measure_capabilities [--backend gloo] [--out hal/data/gloo_capabilities.json]

Two processes try every combination on small tensors; a combination counts as supported only if it
runs on both ranks *and* gives the right answer (checked against a local computation). The result is
data the HAL ships (`hal/data/<backend>_capabilities.json`); `tests/test_cpu_capabilities.py`
re-measures and compares, so the file cannot drift from what torch really does.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hal.capabilities import COLLECTIVES, DTYPES, REDUCE_OPS, REDUCING, torch_dtype

WORLD = 2
_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX,
        "min": dist.ReduceOp.MIN, "product": dist.ReduceOp.PRODUCT, "band": dist.ReduceOp.BAND,
        "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR}


def _input(rank: int, dtype: torch.dtype, n: int = 4) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.tensor([(rank + i) % 2 == 0 for i in range(n)])
    return (torch.arange(n, dtype=torch.float64) + 1 + rank).to(dtype)


def _expected_reduce(op: str, dtype: torch.dtype) -> torch.Tensor:
    xs = [_input(r, dtype).to(torch.float64) if dtype != torch.bool else _input(r, dtype) for r in range(WORLD)]
    if dtype == torch.bool:
        ints = [x.to(torch.int64) for x in xs]
        fold = {"sum": lambda a, b: a | b, "max": lambda a, b: a | b, "min": lambda a, b: a & b,
                "product": lambda a, b: a & b, "band": lambda a, b: a & b, "bor": lambda a, b: a | b,
                "bxor": lambda a, b: a ^ b}.get(op)
        if fold is None:
            return None
        out = ints[0]
        for x in ints[1:]:
            out = fold(out, x)
        return out.to(torch.bool)
    out = xs[0].clone()
    for x in xs[1:]:
        if op in ("sum", "avg"):
            out = out + x
        elif op == "max":
            out = torch.maximum(out, x)
        elif op == "min":
            out = torch.minimum(out, x)
        elif op == "product":
            out = out * x
        elif op in ("band", "bor", "bxor"):
            if dtype.is_floating_point:
                return None
            fn = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}[op]
            out = fn(out.to(torch.int64), x.to(torch.int64)).to(torch.float64)
        else:
            return None
    if op == "avg":
        out = out / WORLD
    return out.to(dtype)


def _try(pg, rank: int, coll: str, dname: str, op: str) -> bool:
    dtype = torch_dtype(dname)
    x = _input(rank, dtype)
    if coll in REDUCING:
        if op not in _OPS:  # premul_sum needs a factor; not expressible as a plain op here
            return False
        expect = _expected_reduce(op, dtype)
        if expect is None:
            expect = torch.zeros(1)  # still try: an op that "works" but we cannot check is refused below
        rop = _OPS[op]
        if coll == "all_reduce":
            y = x.clone()
            pg.allreduce([y], dist.AllreduceOptions() if False else _opts(dist.AllreduceOptions, rop)).wait()
            return expect.numel() == y.numel() and torch.equal(y, expect)
        if coll == "reduce":
            y = x.clone()
            o = _opts(dist.ReduceOptions, rop)
            o.rootRank = 0
            pg.reduce([y], o).wait()
            return rank != 0 or (expect.numel() == y.numel() and torch.equal(y, expect))
        if coll in ("reduce_scatter", "reduce_scatter_tensor"):
            full = torch.cat([x, x])  # each rank contributes its x to both shards
            out = torch.empty_like(x)
            o = _opts(dist.ReduceScatterOptions, rop)
            if coll == "reduce_scatter":
                pg.reduce_scatter([out], [[full[:4], full[4:]]], o).wait()
            else:
                pg._reduce_scatter_base(out, full, o).wait()
            return expect.numel() == out.numel() and torch.equal(out, expect)
    gathered = torch.cat([_input(r, dtype) for r in range(WORLD)])
    if coll == "broadcast":
        y = x.clone()
        o = dist.BroadcastOptions()
        o.rootRank = 0
        pg.broadcast([y], o).wait()
        return torch.equal(y, _input(0, dtype))
    if coll == "all_gather":
        outs = [torch.empty_like(x) for _ in range(WORLD)]
        pg.allgather([outs], [x]).wait()
        return torch.equal(torch.cat(outs), gathered)
    if coll == "all_gather_into_tensor":
        out = torch.empty(WORLD * x.numel(), dtype=dtype)
        pg._allgather_base(out, x).wait()
        return torch.equal(out, gathered)
    if coll == "all_to_all_single":
        out = torch.empty_like(x)
        pg.alltoall_base(out, x, [2, 2], [2, 2], dist.AllToAllOptions()).wait()
        want = torch.cat([_input(r, dtype)[rank * 2:(rank + 1) * 2] for r in range(WORLD)])
        return torch.equal(out, want)
    if coll == "all_to_all":
        ins = list(x.split(2))
        outs = [torch.empty(2, dtype=dtype) for _ in range(WORLD)]
        pg.alltoall(outs, ins, dist.AllToAllOptions()).wait()
        want = [_input(r, dtype)[rank * 2:(rank + 1) * 2] for r in range(WORLD)]
        return all(torch.equal(a, b) for a, b in zip(outs, want))
    if coll == "gather":
        o = dist.GatherOptions()
        o.rootRank = 0
        outs = [[torch.empty_like(x) for _ in range(WORLD)]] if rank == 0 else []
        pg.gather(outs, [x], o).wait()
        return rank != 0 or torch.equal(torch.cat(outs[0]), gathered)
    if coll == "scatter":
        o = dist.ScatterOptions()
        o.rootRank = 0
        out = torch.empty_like(x)
        ins = [[_input(r, dtype) for r in range(WORLD)]] if rank == 0 else []
        pg.scatter([out], ins, o).wait()
        return torch.equal(out, _input(rank, dtype))
    if coll == "send_recv":
        if rank == 0:
            pg.send([x], 1, 0).wait()
            return True
        y = torch.empty_like(x)
        pg.recv([y], 0, 0).wait()
        return torch.equal(y, _input(0, dtype))
    if coll == "barrier":
        pg.barrier().wait()
        return True
    raise ValueError(coll)


def _opts(cls, rop):
    o = cls()
    o.reduceOp = rop
    return o


def _worker(rank: int, backend: str, path: str, queue) -> None:
    store = dist.FileStore(path, WORLD)
    from hal.emulation import create_cpu_process_group
    os.environ["HAL_CPU_CCL"] = backend
    pg = create_cpu_process_group(store, rank, WORLD, timedelta(seconds=20))
    found = []
    for coll in COLLECTIVES:
        for dname in DTYPES:
            for op in (REDUCE_OPS if coll in REDUCING else ("-",)):
                try:
                    ok = _try(pg, rank, coll, dname, op)
                except Exception:
                    ok = False
                # Agree across ranks (both must have succeeded) so later calls stay in lockstep.
                flag = torch.tensor([1 if ok else 0])
                pg.allreduce([flag], _opts(dist.AllreduceOptions, dist.ReduceOp.MIN)).wait()
                if flag.item() == 1:
                    found.append((coll, dname, op))
    if rank == 0:
        queue.put(found)


def measure(backend: str = "gloo") -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "store")
        procs = [ctx.Process(target=_worker, args=(r, backend, path, queue)) for r in range(WORLD)]
        for p in procs:
            p.start()
        found = queue.get(timeout=600)
        for p in procs:
            p.join(60)
    return {"backend": backend, "torch": torch.__version__,
            "source": f"measured with `python -m hal_cpu.measure_capabilities --backend {backend}` on "
                      f"torch {torch.__version__}, {WORLD} processes, checked against local results",
            "entries": sorted(list(e) for e in found)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="gloo", choices=("gloo", "shm"))
    ap.add_argument("--out", help="file to write (default: print to stdout)")
    args = ap.parse_args(argv)
    data = measure(args.backend)
    text = json.dumps(data, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
        print(f"wrote {len(data['entries'])} supported combinations to {args.out}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
