"""`hal bench comm` on the multi-host test bed: hetero vs flat gloo over shaped NICs, next to the
host-aware link model (hal.core.link_model), and the EP all_to_all of a MoE step. Prints figures
(never pass/fail). Needs root.

    python benchmarks/testbed_comm.py                          # 2 hosts x 2 ranks, 200 Mb/s per NIC
    python benchmarks/testbed_comm.py --layout cuda:1+1,ascend:2   # cuda spans hosts 0 and 1
    python benchmarks/testbed_comm.py --rate 100Mb/s --ops all_reduce --max-bytes 64M --json out.json
    python benchmarks/testbed_comm.py --ops moe                # the MoE layer's token all_to_alls

The bed (`--layout`, chip:ranks per host joined by '+', default cuda:2,ascend:2): host 0 runs the
emulated cuda ranks, host 1 the emulated ascend ranks; `cuda:1+1` puts one cuda rank on each of two
hosts (a sub-cluster spanning hosts). Each rank has its own veth NIC shaped by tbf to --rate in both
directions (a line rate this 2-core machine can saturate, so the links and not the CPU bound the
time). Each op is one torchrun job across the hosts running `python -m hal.cli.bench comm --backend
hetero --baseline gloo` (size by size, same job).

The model: `hal.core.link_model.collective_seconds` on `BedSpec.topology()` (payload only, every
byte on the busiest NIC direction at --rate; intra-host steps are shared memory, free next to the
links; an intra-sub-cluster step between hosts crosses the NICs). On 2 x 2, S bytes per rank, B the
rate in bytes/s: hetero all_reduce S/(2B), flat gloo all_reduce 1.5 S/B (two ring edges cross
hosts), all_to_all S/(2B) for both (each rank sends S/4 to each of 2 remote ranks). The wire also
carries Ethernet/IP/TCP headers (about 4.4% at MTU 1500), measured here from the NIC counters.

`moe`: every rank builds one `hal.strategies.moe.MoE` layer (one expert per rank, top-2, no capacity
limit) on the hetero world group and on a flat gloo group, runs forward + backward on random tokens
and times the two forward all_to_alls (dispatch, combine) between barriers, slowest rank; the model
is `all_to_all_seconds` of the exchanged bytes (uneven: what the router chose).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hal.core.link_model import all_to_all_seconds, collective_seconds  # noqa: E402
from hal.testbed import BedSpec, Testbed, parse_rate  # noqa: E402
from hal.testbed.launch import launch  # noqa: E402


def parse_layout(text: str) -> list[tuple[str, list[int]]]:
    """'cuda:1+1,ascend:2' -> [("cuda", [1, 1]), ("ascend", [2])] (hosts in order)."""
    out = []
    for part in text.split(","):
        chip, _, hosts = part.partition(":")
        try:
            out.append((chip.strip(), [int(n) for n in hosts.split("+")]))
        except ValueError:
            raise SystemExit(f"--layout {text!r}: {part!r} is not chip:ranks[+ranks...], e.g. cuda:1+1") from None
    return out


def run_op(bed: Testbed, op: str, args, json_path: str) -> tuple[dict, dict, float]:
    target = ["-m", "hal.cli.bench", "comm", "--op", op, "--backend", "hetero",
              *([] if args.no_baseline else ["--baseline", "gloo"]), "--min-bytes", args.min_bytes,
              "--max-bytes", args.max_bytes, "--step-factor", "2",
              "--iters", str(args.iters), "--warmup", "1", "--repeats", str(args.repeats),
              "--timeout", "600", "--json", json_path]
    before = {h: bed.nic_bytes(h) for h in range(bed.spec.hosts)}
    t0 = time.monotonic()
    job = launch(bed, target, env={"HAL_CPU_CCL": "auto"})
    result = job.wait(args.job_timeout)
    seconds = time.monotonic() - t0
    after = {h: bed.nic_bytes(h) for h in range(bed.spec.hosts)}
    if not result.ok:
        print(result.tail(6000), file=sys.stderr)
        raise SystemExit(f"{op}: the job failed: {result.describe()}")
    print(result.hosts[0].output)
    nic = {f"h{h}/{name}": (after[h][name][0] - before[h][name][0], after[h][name][1] - before[h][name][1])
           for h in after for name in after[h]}
    return json.loads(Path(json_path).read_text()), nic, seconds


# ---- the EP all_to_all of a MoE step (one torchrun job; this file is also the worker) --------------
def moe_worker(tokens: int, hidden: int, repeats: int) -> None:
    """On every rank: a MoE layer on the hetero world group and on a flat gloo group; forward +
    backward `repeats` times; each forward all_to_all timed between barriers of a control group."""
    import datetime

    import torch
    import torch.distributed as dist

    import hal.ccl_bridge  # noqa: F401 - registers "hetero"
    import hal.strategies.moe as moe_mod
    dist.init_process_group("hetero", timeout=datetime.timedelta(seconds=600))
    W, me = dist.get_world_size(), dist.get_rank()
    ctrl = dist.new_group(backend="gloo")
    groups = {"hetero": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    plain = moe_mod._all_to_all
    calls: list[tuple[float, list[int]]] = []

    def timed(x, out_rows, send_splits, recv_splits, group):
        dist.barrier(group=ctrl)
        t0 = time.perf_counter()
        y = plain(x, out_rows, send_splits, recv_splits, group)
        calls.append((time.perf_counter() - t0, [int(s) * hidden * x.element_size() for s in send_splits]))
        return y
    moe_mod._all_to_all = timed
    out = {}
    for name, g in groups.items():
        torch.manual_seed(0)
        layer = moe_mod.MoE(hidden, 16, experts=W, top_k=2, capacity_factor=None, group=g)
        gen = torch.Generator().manual_seed(100 + me)
        for i in range(repeats + 1):
            calls.clear()
            x = torch.randn(tokens, hidden, generator=gen, requires_grad=True)
            layer(x).sum().backward()
            if i == 0:
                continue   # warm-up
            for j, (t, row) in enumerate(calls):
                mine = torch.tensor([t] + row, dtype=torch.float64)
                every = [torch.empty_like(mine) for _ in range(W)]
                dist.all_gather(every, mine, group=ctrl)
                rec = out.setdefault(name, {}).setdefault(("dispatch", "combine")[j], [])
                rec.append({"s": max(e[0].item() for e in every), "matrix": [e[1:].tolist() for e in every]})
    if me == 0:
        print("MOE " + json.dumps(out), flush=True)
    dist.barrier(group=ctrl)
    dist.destroy_process_group()


def run_moe(bed: Testbed, args) -> dict:
    target = [str(Path(__file__).resolve()), "--moe-worker", "--tokens", str(args.moe_tokens), "--hidden",
              str(args.moe_hidden), "--repeats", str(args.repeats)]
    result = launch(bed, target, env={"HAL_CPU_CCL": "auto"}).wait(args.job_timeout)
    lines = [line for line in result.lines if line.startswith("MOE ")]
    if not result.ok or not lines:
        print(result.tail(6000), file=sys.stderr)
        raise SystemExit(f"moe: the job failed: {result.describe()}")
    return json.loads(lines[0][4:])


def moe_table(res: dict, topo) -> list[dict]:
    rows = []
    for step in ("dispatch", "combine"):
        row = {"op": f"moe {step}"}
        for name in ("hetero", "gloo"):
            recs = res[name][step]
            t = statistics.median(r["s"] for r in recs)
            model = statistics.median(all_to_all_seconds(topo, name, r["matrix"]) for r in recs)
            row[f"{name}_ms"], row[f"{name}_model_ms"] = t * 1e3, model * 1e3
            # the mean send buffer of a rank, MiB
            row[f"{name}_MiB"] = statistics.median(sum(map(sum, r["matrix"])) for r in recs) / topo.world_size / 2**20
        rows.append(row)
    return rows


def print_table(out: dict, spec: BedSpec, args) -> list[dict]:
    rate, topo = out["rate_bps"], spec.topology()
    print(f"\n# link-bound model vs measured, {'; '.join(spec.describe())} "
          f"(median of {args.repeats} repeats x {args.iters} iters; times in ms)")
    print("#{:>11} {:>10} {:>10} {:>10} {:>10} {:>11} {:>10} {:>10}".format(
        "op", "size", "hetero", "model", "het/model", "flat gloo", "gloo model", "gloo/het"))
    table = []
    for op, res in out["ops"].items():
        if op == "moe":
            for row in moe_table(res, topo):
                table.append(row)
                print(" {:>11} {:>8.1f}M {:>10.0f} {:>10.0f} {:>9.0f}% {:>11.0f} {:>10.0f} {:>9.2f}x".format(
                    row["op"], row["hetero_MiB"], row["hetero_ms"], row["hetero_model_ms"],
                    100 * row["hetero_model_ms"] / row["hetero_ms"], row["gloo_ms"], row["gloo_model_ms"],
                    row["gloo_ms"] / row["hetero_ms"]))
            continue
        rows = {r["size_bytes"]: r for r in res["report"]["rows"]}
        base = {r["size_bytes"]: r for r in res["report"]["baseline_rows"]}
        for size, r in rows.items():
            het_ms = r["time_us"] / 1e3
            gl_ms = base[size]["time_us"] / 1e3 if size in base else float("nan")
            m_het = collective_seconds(topo, op, "hetero", size) * 1e3
            m_gl = collective_seconds(topo, op, "gloo", size) * 1e3
            row = {"op": op, "size": size, "hetero_ms": het_ms, "model_ms": m_het, "hetero_of_model": m_het / het_ms,
                   "gloo_ms": gl_ms, "gloo_model_ms": m_gl, "gloo_over_hetero": gl_ms / het_ms}
            table.append(row)
            print(" {:>11} {:>9}M {:>10.0f} {:>10.0f} {:>9.0f}% {:>11.0f} {:>10.0f} {:>9.2f}x".format(
                op, size >> 20, het_ms, m_het, 100 * m_het / het_ms, gl_ms, m_gl, gl_ms / het_ms))
        payload_tx = sum(v[0] for v in res["nic_bytes"].values())
        print(f"# {op}: NIC bytes sent during the job: " + ", ".join(
            f"{k} {v[0] / 2**20:.0f} MiB" for k, v in sorted(res["nic_bytes"].items())) +
            f" (total {payload_tx / 2**20:.0f} MiB)")
    print(f"# rate {rate / 1e6:g} Mb/s per NIC and direction; load average {os.getloadavg()[0]:.1f} at the end")
    return table


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", default="200Mb/s", help="line rate per NIC and direction (default 200Mb/s)")
    p.add_argument("--layout", default="cuda:2,ascend:2", help="chip:ranks per host ('+' between hosts), "
                   "sub-clusters in host order (default cuda:2,ascend:2; cuda:1+1,ascend:2 spans two hosts)")
    p.add_argument("--ops", default="all_reduce,all_to_all", help="all_reduce, all_to_all, moe")
    p.add_argument("--min-bytes", default="16M")
    p.add_argument("--max-bytes", default="64M")
    p.add_argument("--iters", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--moe-tokens", type=int, default=2048, help="tokens per rank in the MoE step")
    p.add_argument("--moe-hidden", type=int, default=1024)
    p.add_argument("--job-timeout", type=float, default=1200.0)
    p.add_argument("--json", default=None, help="write every figure here")
    p.add_argument("--no-baseline", action="store_true", help="hetero only (no flat gloo run): quicker sweeps")
    p.add_argument("--moe-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--tokens", type=int, help=argparse.SUPPRESS)
    p.add_argument("--hidden", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.moe_worker:
        moe_worker(args.tokens, args.hidden, args.repeats)
        return 0
    rate = parse_rate(args.rate)
    spec = BedSpec.of_sub_clusters(parse_layout(args.layout), rate=rate)
    out: dict = {"rate_bps": rate, "layout": args.layout, "ops": {}, "load_start": os.getloadavg()}
    with Testbed(spec) as bed, tempfile.TemporaryDirectory() as tmp:
        print(f"# test bed {bed.name}: " + "; ".join(bed.spec.describe()), flush=True)
        for op in args.ops.split(","):
            if op == "moe":
                out["ops"][op] = run_moe(bed, args)
                continue
            report, nic, seconds = run_op(bed, op, args, os.path.join(tmp, f"{op}.json"))
            out["ops"][op] = {"report": report, "nic_bytes": nic, "job_seconds": seconds}
    out["load_end"] = os.getloadavg()
    out["table"] = print_table(out, spec, args)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, default=str))
        print(f"# wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
