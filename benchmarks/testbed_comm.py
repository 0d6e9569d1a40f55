"""`hal bench comm` on the multi-host test bed: hetero vs flat gloo over shaped rails, next to the
link-bound model. Prints figures (never pass/fail). Needs root.

    python benchmarks/testbed_comm.py                          # 2 hosts x 2 ranks, 200 Mb/s per NIC
    python benchmarks/testbed_comm.py --rate 100Mb/s --ops all_reduce --max-bytes 64M --json out.json

The bed: host 0 runs 2 emulated cuda ranks, host 1 2 emulated ascend ranks; each rank has its own
veth NIC shaped by tbf to --rate in both directions (a line rate this 2-core machine can saturate, so
the links and not the CPU bound the time). Each op is one torchrun job across the hosts running
`python -m hal.cli.bench comm --backend hetero --baseline gloo` (size by size, same job), with
`--stages` for all_reduce (the bridge's own stages timed one by one on groups shaped like its own).

Link-bound model (payload only; S = message bytes per rank, B = --rate in bytes/s, k = 2 sub-clusters
of n = 2 ranks, W = 4):
- hetero all_reduce: the intra steps are shared memory (free next to the link); each rank's rail
  carries its 1/n share: 2(k-1)/k * S / (n B) = S / (2B).
- flat gloo all_reduce: gloo's ring over ranks 0-1-2-3-0; two ring edges cross hosts, each on its own
  NIC pair (the bed's rail-matched routes), and every edge carries 2(W-1)/W * S: 1.5 S / B.
- all_to_all (both backends: the bridge sends it over its global gloo group): each rank sends S/W to
  each of the 2 remote ranks; per NIC 2 * S/W: S / (2B).
The wire also carries Ethernet/IP/TCP headers (about 4.4% at MTU 1500), measured here from the NIC
counters (`wire/payload`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hal.testbed import BedSpec, Testbed, parse_rate  # noqa: E402
from hal.testbed.launch import launch  # noqa: E402

CHIPS = ["cuda", "cuda", "ascend", "ascend"]


def model_s(op: str, backend: str, size: int, rate_bps: float, w: int = 4, n: int = 2, k: int = 2) -> float:
    """all_reduce seconds at the link rate alone (see the module docstring)."""
    if op != "all_reduce":
        raise ValueError(f"op={op!r}: model_s models all_reduce; all_to_all_model_s the other")
    b = rate_bps / 8
    if backend == "hetero":
        return 2 * (k - 1) / k * size / (n * b)
    return 2 * (w - 1) / w * size / b


def all_to_all_model_s(size: int, rate_bps: float, w: int = 4, n: int = 2) -> float:
    """Per NIC: this host's n ranks each send S/W to each of the W-n remote ranks; the W-n destinations
    spread over the n NICs (rail-matched routes): n * (W-n) * S/W / n bytes per NIC."""
    return (w - n) * size / w / (rate_bps / 8)


def run_op(bed: Testbed, op: str, args, json_path: str) -> tuple[dict, dict, float]:
    target = ["-m", "hal.cli.bench", "comm", "--op", op, "--backend", "hetero",
              *([] if args.no_baseline else ["--baseline", "gloo"]), "--min-bytes", args.min_bytes, "--max-bytes", args.max_bytes, "--step-factor", "2",
              "--iters", str(args.iters), "--warmup", "1", "--repeats", str(args.repeats),
              "--timeout", "600", "--json", json_path]
    if op == "all_reduce":
        target.append("--stages")
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", default="200Mb/s", help="line rate per NIC and direction (default 200Mb/s)")
    p.add_argument("--ops", default="all_reduce,all_to_all")
    p.add_argument("--min-bytes", default="16M")
    p.add_argument("--max-bytes", default="64M")
    p.add_argument("--iters", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--job-timeout", type=float, default=1200.0)
    p.add_argument("--json", default=None, help="write every figure here")
    p.add_argument("--no-baseline", action="store_true", help="hetero only (no flat gloo run): quicker sweeps")
    args = p.parse_args()
    rate = parse_rate(args.rate)
    out = {"rate_bps": rate, "ops": {}}
    with Testbed(BedSpec.of([2, 2], rate=rate, chips=CHIPS)) as bed, tempfile.TemporaryDirectory() as tmp:
        print(f"# test bed {bed.name}: " + "; ".join(bed.spec.describe()), flush=True)
        for op in args.ops.split(","):
            report, nic, seconds = run_op(bed, op, args, os.path.join(tmp, f"{op}.json"))
            out["ops"][op] = {"report": report, "nic_bytes": nic, "job_seconds": seconds}
    print(f"\n# link-bound model vs measured, 2 hosts x 2 ranks, {rate / 1e6:g} Mb/s per NIC and direction "
          f"(median of {args.repeats} repeats x {args.iters} iters; times in ms)")
    print("#{:>11} {:>10} {:>10} {:>10} {:>10} {:>11} {:>10} {:>10}".format(
        "op", "size", "hetero", "model", "het/model", "flat gloo", "gloo model", "gloo/het"))
    table = []
    for op, res in out["ops"].items():
        rows = {r["size_bytes"]: r for r in res["report"]["rows"]}
        base = {r["size_bytes"]: r for r in res["report"]["baseline_rows"]}
        for size, r in rows.items():
            het_ms = r["time_us"] / 1e3
            gl_ms = base[size]["time_us"] / 1e3 if size in base else float("nan")
            if op == "all_to_all":
                m_het = m_gl = all_to_all_model_s(size, rate) * 1e3
            else:
                m_het = model_s(op, "hetero", size, rate) * 1e3
                m_gl = model_s(op, "gloo", size, rate) * 1e3
            row = {"op": op, "size": size, "hetero_ms": het_ms, "model_ms": m_het, "hetero_of_model": m_het / het_ms,
                   "gloo_ms": gl_ms, "gloo_model_ms": m_gl, "gloo_over_hetero": gl_ms / het_ms}
            table.append(row)
            print(" {:>11} {:>9}M {:>10.0f} {:>10.0f} {:>9.0f}% {:>11.0f} {:>10.0f} {:>9.2f}x".format(
                op, size >> 20, het_ms, m_het, 100 * m_het / het_ms, gl_ms, m_gl, gl_ms / het_ms))
        st = res["report"].get("stages")
        if st:
            print(f"# {op} hetero stages (ms): " + "; ".join(
                f"{s['size_bytes'] >> 20}M: intra {s['intra_in_us'] / 1e3:.0f} | rail {s['cross_us'] / 1e3:.0f} | "
                f"intra {s['intra_out_us'] / 1e3:.0f}" for s in st))
        payload_tx = sum(v[0] for v in res["nic_bytes"].values())
        print(f"# {op}: NIC bytes sent during the job: " + ", ".join(
            f"{k} {v[0] / 2**20:.0f} MiB" for k, v in sorted(res["nic_bytes"].items())) + f" (total {payload_tx / 2**20:.0f} MiB)")
    out["table"] = table
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, default=str))
        print(f"# wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
