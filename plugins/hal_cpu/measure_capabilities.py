"""Measure which collective x dtype x reduce op a CCL really supports, and write the matrix.

    python -m hal_cpu.measure_capabilities [--backend gloo|shm] [--out hal/data/gloo_capabilities.json]
    python -m hal_cpu.measure_capabilities --plugin acme [--chip acme] [--format python] [--out F]
        [--collectives all_reduce,broadcast] [--dtypes float32,bfloat16]

Two processes try every combination on small tensors; a combination counts as supported only if it
runs on both ranks *and* gives the right answer (checked against a local computation). Without
`--plugin` it measures the HAL's CPU fabric: the result is data the HAL ships
(`hal/data/<backend>_capabilities.json`, read by `hal.sdk.cpu_fabric_capabilities`). With
`--plugin NAME` (an entry point of group hal.plugins, or a module path) it binds that plugin's chip
natively in each process (ranks 0 and 1, LOCAL_RANK = rank: two devices) and measures the group its
`hal_create_process_group` builds, on the chip's tensors: a vendor's evidence for
`hal_collective_capabilities`. `--format python` prints the `sdk.CapabilityMatrix(...)` to return.
A combination that hangs is not detected as such: the group's own timeout (20 s) must raise.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hal import sdk
from hal.sdk import COLLECTIVES, DTYPES, REDUCE_OPS, REDUCING, TORCH_REDUCE_OPS, torch_dtype

WORLD = 2
_OPS = TORCH_REDUCE_OPS  # hal's reduce-op name table (premul_sum aside: it needs a factor)


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


def _try(pg, rank: int, coll: str, dname: str, op: str, dev: torch.device = torch.device("cpu")) -> bool:
    dtype = torch_dtype(dname)
    x = _input(rank, dtype).to(dev)
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
            return expect.numel() == y.numel() and _equal_on_host(y, expect)
        if coll == "reduce":
            y = x.clone()
            o = _opts(dist.ReduceOptions, rop)
            o.rootRank = 0
            pg.reduce([y], o).wait()
            return rank != 0 or (expect.numel() == y.numel() and _equal_on_host(y, expect))
        if coll in ("reduce_scatter", "reduce_scatter_tensor"):
            full = torch.cat([x, x])  # each rank contributes its x to both shards
            out = torch.empty_like(x)
            o = _opts(dist.ReduceScatterOptions, rop)
            if coll == "reduce_scatter":
                pg.reduce_scatter([out], [[full[:4], full[4:]]], o).wait()
            else:
                pg._reduce_scatter_base(out, full, o).wait()
            return expect.numel() == out.numel() and _equal_on_host(out, expect)
    gathered = torch.cat([_input(r, dtype) for r in range(WORLD)]).to(dev)
    if coll == "broadcast":
        y = x.clone()
        o = dist.BroadcastOptions()
        o.rootRank = 0
        pg.broadcast([y], o).wait()
        return _equal_on_host(y, _input(0, dtype))
    if coll == "all_gather":
        outs = [torch.empty_like(x) for _ in range(WORLD)]
        pg.allgather([outs], [x]).wait()
        return _equal_on_host(torch.cat(outs), gathered)
    if coll == "all_gather_into_tensor":
        out = torch.empty(WORLD * x.numel(), dtype=dtype, device=dev)
        pg._allgather_base(out, x).wait()
        return _equal_on_host(out, gathered)
    if coll == "all_to_all_single":
        out = torch.empty_like(x)
        pg.alltoall_base(out, x, [2, 2], [2, 2], dist.AllToAllOptions()).wait()
        want = torch.cat([_input(r, dtype)[rank * 2:(rank + 1) * 2] for r in range(WORLD)]).to(dev)
        return _equal_on_host(out, want)
    if coll == "all_to_all":
        ins = list(x.split(2))
        outs = [torch.empty(2, dtype=dtype, device=dev) for _ in range(WORLD)]
        pg.alltoall(outs, ins, dist.AllToAllOptions()).wait()
        want = [_input(r, dtype)[rank * 2:(rank + 1) * 2] for r in range(WORLD)]
        return all(_equal_on_host(a, b) for a, b in zip(outs, want))
    if coll == "gather":
        o = dist.GatherOptions()
        o.rootRank = 0
        outs = [[torch.empty_like(x) for _ in range(WORLD)]] if rank == 0 else []
        pg.gather(outs, [x], o).wait()
        return rank != 0 or _equal_on_host(torch.cat(outs[0]), gathered)
    if coll == "scatter":
        o = dist.ScatterOptions()
        o.rootRank = 0
        out = torch.empty_like(x)
        ins = [[_input(r, dtype).to(dev) for r in range(WORLD)]] if rank == 0 else []
        pg.scatter([out], ins, o).wait()
        return _equal_on_host(out, _input(rank, dtype))
    if coll == "send_recv":
        if rank == 0:
            pg.send([x], 1, 0).wait()
            return True
        y = torch.empty_like(x)
        pg.recv([y], 0, 0).wait()
        return _equal_on_host(y, _input(0, dtype))
    if coll == "barrier":
        pg.barrier().wait()
        return True
    raise ValueError(coll)


def _equal_on_host(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.cpu(), b.cpu()
    if a.dtype == b.dtype and a.is_floating_point() and a.element_size() == 1:  # float8: torch 2.5 has no
        a, b = a.view(torch.uint8), b.view(torch.uint8)  # torch.equal for it; the same bits are equal
    return torch.equal(a, b)


def _opts(cls, rop):
    o = cls()
    o.reduceOp = rop
    return o


def _group(rank: int, backend: str, plugin: Optional[str], chip: Optional[str], store) -> tuple:
    """(group, device, command-line flag, details, chip): the CPU fabric, or the plugin's native group."""
    timeout = timedelta(seconds=20)
    if plugin is None and backend == "gloo":  # torch's own gloo: the HAL's gloo group refuses what this file omits
        return dist.ProcessGroupGloo(store, rank, WORLD, timeout), torch.device("cpu"), "--backend gloo", "", "cpu"
    if plugin is None:
        os.environ["HAL_CPU_CCL"] = backend
        group = sdk.create_cpu_process_group(store, rank, WORLD, timeout)
        return group, torch.device("cpu"), f"--backend {backend}", "", "cpu"
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD))
    pm = sdk.PluginManager()
    pm.load_entry_points(env={"HAL_PLUGINS": plugin})
    record = next(iter(pm.plugins.values()))
    acc = sdk.bind(chip or record.chips[0], pm=pm)  # native: ChipUnavailableError without the hardware
    pg = acc.new_process_group(store, rank, WORLD, timeout)
    detail = (f" (chip {acc.chip.name} natively on {acc.profile.model}, device {acc.device}, ccl "
              f"{acc.chip.ccl_backend} as {type(pg).__name__})")
    return pg, acc.device, f"--plugin {plugin}", detail, acc.chip.name


def _worker(rank: int, backend: str, path: str, queue, plugin: Optional[str] = None,
            chip: Optional[str] = None, collectives: tuple = COLLECTIVES, dtypes: tuple = DTYPES) -> None:
    store = dist.FileStore(path, WORLD)
    try:
        pg, dev, what, detail, chip = _group(rank, backend, plugin, chip, store)
    except Exception as exc:  # reported by the parent instead of a hang on the queue
        queue.put((rank, f"{type(exc).__name__}: {exc}"))
        return
    found = []
    for coll in collectives:
        for dname in dtypes:
            for op in (REDUCE_OPS if coll in REDUCING else ("-",)):
                try:
                    ok = _try(pg, rank, coll, dname, op, dev)
                except Exception:
                    ok = False
                # Agree across ranks (both must have succeeded) so later calls stay in lockstep.
                flag = torch.tensor([1 if ok else 0], device=dev)
                pg.allreduce([flag], _opts(dist.AllreduceOptions, dist.ReduceOp.MIN)).wait()
                if flag.item() == 1:
                    found.append((coll, dname, op))
    if rank == 0:
        queue.put((rank, (found, what, detail, chip)))


def measure(backend: str = "gloo", plugin: Optional[str] = None, chip: Optional[str] = None,
            collectives: tuple = COLLECTIVES, dtypes: tuple = DTYPES) -> dict:
    for what, names, known in (("collective", collectives, COLLECTIVES), ("dtype", dtypes, DTYPES)):
        bad = [n for n in names if n not in known]
        if bad:
            raise ValueError(f"measure_capabilities: unknown {what} {bad}; known: {list(known)}")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "store")
        procs = [ctx.Process(target=_worker, args=(r, backend, path, queue, plugin, chip,
                                                             tuple(collectives), tuple(dtypes))) for r in range(WORLD)]
        for p in procs:
            p.start()
        try:
            rank, result = queue.get(timeout=900)
        finally:
            for p in procs:
                p.join(60)
                if p.is_alive():
                    p.kill()
    if isinstance(result, str):
        raise RuntimeError(f"measure_capabilities: rank {rank} could not build the group: {result}")
    found, what, detail, chip = result
    scope = "".join(f" --{flag} {','.join(names)}" for flag, names, every in
                    (("collectives", collectives, COLLECTIVES), ("dtypes", dtypes, DTYPES)) if tuple(names) != every)
    return {"backend": backend if plugin is None else None, "plugin": plugin, "chip": chip, "torch": torch.__version__,
            "source": f"measured with `python -m hal_cpu.measure_capabilities {what}{scope}`{detail} on "
                      f"torch {torch.__version__}, {WORLD} processes, checked against local results",
            "entries": sorted(list(e) for e in found)}


def as_python(data: dict, chip: str) -> str:
    """The `sdk.CapabilityMatrix(...)` expression a plugin's hal_collective_capabilities returns."""
    entries = ",\n    ".join(repr(tuple(e)) for e in data["entries"])
    return (f"sdk.CapabilityMatrix(chip={chip!r}, source={data['source']!r}, entries=frozenset({{\n"
            f"    {entries},\n}}))")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="gloo", choices=("gloo", "shm"), help="the CPU fabric to measure")
    ap.add_argument("--plugin", help="measure this plugin's native group instead (entry point or module path)")
    ap.add_argument("--chip", help="with --plugin: which of its chips (default: its first)")
    ap.add_argument("--collectives", help="comma-separated collectives to try (default: all)")
    ap.add_argument("--dtypes", help="comma-separated dtypes to try (default: all)")
    ap.add_argument("--format", default="json", choices=("json", "python"),
                    help="json (what hal/data holds) or python (an sdk.CapabilityMatrix expression)")
    ap.add_argument("--out", help="file to write (default: print to stdout)")
    args = ap.parse_args(argv)
    data = measure(args.backend, args.plugin, args.chip,
                   tuple(args.collectives.split(",")) if args.collectives else COLLECTIVES,
                   tuple(args.dtypes.split(",")) if args.dtypes else DTYPES)
    text = as_python(data, data["chip"]) if args.format == "python" else json.dumps(data, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
        print(f"wrote {len(data['entries'])} supported combinations to {args.out}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
