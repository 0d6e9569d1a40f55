"""Rail primitives on the test bed, timed one by one: what one shaped rail pair does with gloo.

    python benchmarks/testbed_probe.py --rate 200Mb/s --bytes 16M      # brings up a 2x2 bed itself

On 2 hosts x 2 ranks, the two rails (ranks 0-2 and 1-3, each over its own pair of NICs) run at once:
- `a2a`: gloo all_to_all_single of S bytes per rank (S/2 to the rail peer: what the bridge's
  all_to_all rail step sends on 2+2);
- `duplex`: isend + irecv of S/2 both ways at once (the link-bound lower bound of `a2a`);
- `duplex_chunked`: the same cut into 8 messages per direction, all posted at once;
- `duplex_2groups`: `duplex` with each direction on its own gloo group (its own TCP connection);
- `oneway`: S/2 from the host-0 member to the host-1 member only;
- `allreduce`: gloo all_reduce of S/2 (the bridge's all_reduce rail step on 2+2);
- `allreduce_x8`: the same S/2 as 8 back-to-back all_reduces of S/16 (what chunking costs per op);
- `flat_a2a`: gloo all_to_all_single of S bytes per rank over all 4 ranks (the flat baseline).
Each printed with the link model S/2 / B (B = rate in bytes/s; payload only). Prints figures only.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path


def worker(nbytes: int, repeats: int) -> None:
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank = dist.get_rank()
    rails = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    rail = rails[rank % 2]
    rails_b = [dist.new_group([0, 2]), dist.new_group([1, 3])]   # a second gloo group (own TCP pairs) per rail
    rail_b = rails_b[rank % 2]
    peer = {0: 2, 2: 0, 1: 3, 3: 1}[rank]
    n = nbytes // 4
    x, y = torch.ones(n), torch.empty(n)
    half, half_out = torch.ones(n // 2), torch.empty(n // 2)

    def a2a():
        dist.all_to_all_single(y, x, group=rail)

    def duplex():
        s = dist.isend(half, peer)
        r = dist.irecv(half_out, peer)
        s.wait()
        r.wait()

    def duplex_chunked(chunks=8):
        parts = half.chunk(chunks)
        outs = half_out.chunk(chunks)
        works = [dist.isend(p, peer, tag=i) for i, p in enumerate(parts)]
        works += [dist.irecv(o, peer, tag=i) for i, o in enumerate(outs)]
        for w in works:
            w.wait()

    def duplex_2groups():
        # each direction on its own gloo group: the host-0 member sends on `rail`, receives on `rail_b`
        out_g, in_g = (rail, rail_b) if rank < 2 else (rail_b, rail)
        s = dist.isend(half, peer, group=out_g)
        r = dist.irecv(half_out, peer, group=in_g)
        s.wait()
        r.wait()

    def oneway():
        if rank < 2:
            dist.send(half, peer)
        else:
            dist.recv(half_out, peer)

    def allreduce():
        dist.all_reduce(half, group=rail)

    def allreduce_chunks(chunks=8):
        # the same S/2 as `allreduce`, as 8 back-to-back all_reduces of S/16: the per-op cost of chunking
        for part in half.chunk(chunks):
            dist.all_reduce(part, group=rail)

    def flat_a2a():
        dist.all_to_all_single(y, x)

    out = {}
    for name, fn in (("a2a", a2a), ("duplex", duplex), ("duplex_chunked", duplex_chunked),
                     ("duplex_2groups", duplex_2groups), ("oneway", oneway), ("allreduce", allreduce),
                     ("allreduce_x8", allreduce_chunks),
                     ("flat_a2a", flat_a2a)):
        fn()
        times = []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            t = torch.tensor([time.perf_counter() - t0])
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            times.append(t.item())
        out[name] = statistics.median(times)
    if rank == 0:
        print("PROBE " + json.dumps(out), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", default="200Mb/s")
    p.add_argument("--bytes", default="16M")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--queue-ms", type=float, default=100.0, help="tbf queue length in ms of line rate")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    from hal.bench.harness import parse_size
    nbytes = parse_size(args.bytes)
    if args.worker:
        worker(nbytes, args.repeats)
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from hal.testbed import BedSpec, Testbed, parse_rate
    from hal.testbed.launch import launch
    rate = parse_rate(args.rate)
    with Testbed(BedSpec.of([2, 2], rate=rate, queue_ms=args.queue_ms)) as bed:
        job = launch(bed, [str(Path(__file__).resolve()), "--worker", "--bytes", args.bytes, "--repeats",
                           str(args.repeats)], env={"HAL_CPU_CCL": "gloo"})
        result = job.wait(900)
    lines = [l for l in result.lines if l.startswith("PROBE ")]
    if not lines:
        print(result.tail(), file=sys.stderr)
        return 1
    res = json.loads(lines[0][6:])
    model = nbytes / 2 / (rate / 8)
    print(f"# rail primitives, 2 hosts x 2 ranks, {rate / 1e6:g} Mb/s per NIC (tbf queue {args.queue_ms:g} ms), "
          f"S = {nbytes >> 20} MiB per rank, "
          f"median of {args.repeats}; model S/2 / B = {model * 1e3:.0f} ms")
    for name, t in res.items():
        print(f"  {name:<14} {t * 1e3:8.0f} ms   {model / t * 100:5.0f}% of S/2/B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
