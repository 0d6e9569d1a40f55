"""Timed emulation (hal.emulation.timed) against speed dilation: speed ratio between two emulated chips, and step repeatability.

    python benchmarks/timed_emulation.py [--ranks 4 8] [--steps 8] [--warmup 2] [--scale S] [--matmul 1024]
                                         [--modes timed dilation] [--only ratio|repeat] [--json out.json]

Every chip here is EMULATED on this host's CPU; communication is the host's real CPU fabric.

(a) speed ratio: HAL_EMULATE=cuda:n/2,ascend:n/2. Every rank runs the same local training step (the
    trainer's tiny GPT, examples/models/tiny.toml with vocab 256, seq 64; forward, backward, AdamW; no
    collective inside the timed region) from a common barrier, synchronised at both ends. Measured:
    median ascend step / median cuda step. Target: timed, the ratio of the two clocks' charged times
    (the profiles through hal.emulation.timed's cost formula); dilation, its slow-down factor (bf16 peak ratio).
    The tiny GPT's ops are all memory-bound at these chips' figures (its ratio is the bandwidth
    ratio); `--matmul 1024` adds a compute-bound step (one 1024^3 matmul: the bf16 peak ratio).
(b) repeatability: the trainer's step (hal.strategies.apply.apply_plan of Plan.even: DDP over every
    rank, `hetero` backend) on the same cluster; per step the slowest rank's time from a common
    barrier to the end of its optimizer step, synchronised. Printed: median and (max - min) / median.

Prints the host's load average before and after each run (the host is shared: that is the point).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MODEL = dict(name="tiny", layers=4, hidden=32, heads=4, ffn=64, vocab=256, seq=64)  # examples/train/tiny.toml
GLOBAL_BATCH = 16
TIMEOUT_S = 300.0

_book = None


# ---- on every rank (WorkerPool) -------------------------------------------------------------------
def w_init() -> dict:
    import torch
    import torch.distributed as dist

    import hal.ccl_bridge  # noqa: F401 - registers the `hetero` backend
    import hal
    global _book
    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("hetero", timeout=timedelta(seconds=TIMEOUT_S))
        _book = dist.new_group(backend="gloo", timeout=timedelta(seconds=TIMEOUT_S))
    acc = hal.accelerator()
    return {"rank": dist.get_rank(), "chip": acc.chip.name}


def _clock_stats():
    from hal.emulation import timed
    c = timed.active_clock()
    return c.stats() if c is not None else None


def _reset_clock():
    from hal.emulation import timed
    c = timed.active_clock()
    if c is not None:
        c.reset_stats()


def _timed_steps(acc, warmup: int, steps: int, step) -> dict:
    """Run `step()` warmup + steps times, each timed from a common barrier (the device synchronised on
    both sides) to its own synchronisation; this rank's wall and charged (busy) seconds per step."""
    import torch.distributed as dist
    times, busy = [], []
    for _ in range(warmup + steps):
        acc.synchronize()
        dist.barrier(group=_book)
        acc.synchronize()
        _reset_clock()
        t0 = time.perf_counter()
        step()
        acc.synchronize()
        times.append(time.perf_counter() - t0)
        st = _clock_stats()
        busy.append(st["busy_s"] if st else None)
    return {"chip": acc.chip.name, "times": times[warmup:], "busy": busy[warmup:],
            "dilation": getattr(acc.runtime, "dilation", 1.0), "clock": _clock_stats()}


def w_local_steps(warmup: int, steps: int) -> dict:
    """(a) the same local step on every rank; no collective between the two synchronisations."""
    import torch
    import torch.distributed as dist

    import hal
    from hal.strategies.models import ModelConfig, build_model
    from hal.strategies.models.data import lm_loss_sum
    acc = hal.accelerator()
    cfg = ModelConfig(**MODEL)
    net = build_model(cfg, 0)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, foreach=False)
    rows = GLOBAL_BATCH // dist.get_world_size()
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, cfg.vocab, (rows, cfg.seq + 1), generator=g)
    x, y = data[:, :-1], data[:, 1:]

    def step():
        loss = lm_loss_sum(net(x), y) / y.numel()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {**_timed_steps(acc, warmup, steps, step), "cpu_s": time.process_time()}


def w_matmul_steps(warmup: int, steps: int, n: int) -> dict:
    """(a') a compute-bound step: one n x n x n matmul (at n = 1024, 2n^3 / 12 n^2 bytes = 171 FLOP per
    byte, above both chips' bf16 FLOP/s / bytes/s: 133 for H100, 100 for 910B2)."""
    import torch

    import hal
    acc = hal.accelerator()
    a, b = torch.randn(n, n), torch.randn(n, n)
    return _timed_steps(acc, warmup, steps, lambda: a @ b)


def w_train_steps(warmup: int, steps: int) -> dict:
    """(b) the trainer's step: apply_plan(Plan.even) (DDP over every rank) + AdamW."""
    import torch
    import torch.distributed as dist

    import hal
    from hal.core.topology import Topology
    from hal.strategies.apply import apply_plan
    from hal.strategies.models import ModelConfig, build_model
    from hal.strategies.plan import Plan
    acc = hal.accelerator()
    cfg = ModelConfig(**MODEL)
    topo = Topology.from_env(world_size=dist.get_world_size())
    plan = Plan.even(topo, cfg, GLOBAL_BATCH, 1)
    net = build_model(cfg, 0)
    run = apply_plan(net, plan, topo, model_cfg=cfg, timeout=timedelta(seconds=TIMEOUT_S))
    params = run.parameters()
    opt = torch.optim.AdamW(params, lr=1e-3, foreach=False)
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, cfg.vocab, (GLOBAL_BATCH, cfg.seq + 1), generator=g)
    x, y = data[:, :-1], data[:, 1:]
    times = []
    for i in range(warmup + steps):
        acc.synchronize()
        dist.barrier(group=_book)
        acc.synchronize()
        if i == warmup:
            _reset_clock()
        t0 = time.perf_counter()
        run.step(x, y)
        opt.step()
        opt.zero_grad(set_to_none=True)
        acc.synchronize()
        times.append(time.perf_counter() - t0)
    del run, opt
    return {"chip": acc.chip.name, "times": times[warmup:], "clock": _clock_stats()}


# ---- driver -----------------------------------------------------------------------------------------
def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _env(mode: str, emap: str, scale) -> dict:
    env = {"HAL_EMULATE": emap, "OMP_NUM_THREADS": "1"}
    if mode == "timed":
        env["HAL_EMULATE_TIMED"] = "1"
        env["HAL_EMULATE_TIMED_DTYPE"] = "bfloat16"  # its float32 ops at bf16 (910B2, P800: no fp32 figure)
        if scale:
            env["HAL_EMULATE_TIME_SCALE"] = repr(scale)
    elif mode == "dilation":
        env["HAL_EMULATE_DILATION"] = "1"
    return env


def _overruns(results) -> str:
    """Overruns summed over ranks and the largest host-only gap (clock.stats(); the rest is in --json)."""
    cs = [r["clock"] for r in results if r.get("clock")]
    if not cs:
        return "-"
    return (f"{sum(c['overrun_count'] for c in cs)} ({sum(c['overrun_s'] for c in cs) * 1e3:.1f} ms), host gaps "
            f"{max(c['host_gap_s'] for c in cs) * 1e3:.1f} ms")


def bench_ratio(n: int, mode: str, warmup: int, steps: int, scale, matmul: int = 0) -> dict:
    from hal.testing import WorkerPool
    emap = f"cuda:{n // 2},ascend:{n // 2}"
    load0 = _load()
    with WorkerPool(n, env=_env(mode, emap, scale)) as pool:
        pool.run(w_init, timeout=TIMEOUT_S)
        if matmul:
            res = pool.run(w_matmul_steps, warmup, steps, matmul, timeout=TIMEOUT_S * 2)
        else:
            res = pool.run(w_local_steps, warmup, steps, timeout=TIMEOUT_S * 2)
    by = {c: [t for r in res if r["chip"] == c for t in r["times"]] for c in ("cuda", "ascend")}
    med = {c: statistics.median(v) for c, v in by.items()}
    measured = med["ascend"] / med["cuda"]
    if mode == "timed":
        busy = {c: statistics.median([b for r in res if r["chip"] == c for b in r["busy"]]) for c in by}
        target, what = busy["ascend"] / busy["cuda"], "charged-time ratio (profiles)"
    else:
        dil = {r["chip"]: r["dilation"] for r in res}
        target, what = dil["ascend"] / dil["cuda"], "dilation ratio (bf16 peaks)"
    err = measured / target - 1
    row = {"test": f"ratio matmul {matmul}" if matmul else "ratio", "ranks": n, "mode": mode, "cuda_step_s": med["cuda"], "ascend_step_s": med["ascend"],
           "clocks": [r["clock"] for r in res],
           "measured_ratio": measured, "target_ratio": target, "target": what, "error": err,
           "overruns": _overruns(res), "load_before": load0, "load_after": _load()}
    print(f"  {row['test']:<7} n={n} {mode:<8} cuda {med['cuda'] * 1e3:8.1f} ms  ascend {med['ascend'] * 1e3:8.1f} ms  "
          f"measured {measured:6.3f}  target {target:6.3f} ({what})  error {err * 100:+6.1f}%  "
          f"overruns {row['overruns']}  load {load0} -> {row['load_after']}", flush=True)
    return row


def bench_repeat(n: int, mode: str, warmup: int, steps: int, scale) -> dict:
    from hal.testing import WorkerPool
    emap = f"cuda:{n // 2},ascend:{n // 2}"
    load0 = _load()
    with WorkerPool(n, env=_env(mode, emap, scale)) as pool:
        pool.run(w_init, timeout=TIMEOUT_S)
        res = pool.run(w_train_steps, warmup, steps, timeout=TIMEOUT_S * 2)
    per_step = [max(r["times"][i] for r in res) for i in range(steps)]
    med = statistics.median(per_step)
    spread = (max(per_step) - min(per_step)) / med
    row = {"test": "repeat", "ranks": n, "mode": mode, "median_s": med, "min_s": min(per_step),
           "max_s": max(per_step), "spread": spread, "steps": per_step, "overruns": _overruns(res),
           "clocks": [r["clock"] for r in res],
           "load_before": load0, "load_after": _load()}
    print(f"  repeat  n={n} {mode:<8} median {med * 1e3:8.1f} ms  min {min(per_step) * 1e3:8.1f}  "
          f"max {max(per_step) * 1e3:8.1f}  spread {spread * 100:5.1f}%  overruns {row['overruns']}  "
          f"load {load0} -> {row['load_after']}", flush=True)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, nargs="+", default=[4, 8])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--scale", type=float, default=None, help="HAL_EMULATE_TIME_SCALE (default: hal.emulation.timed's)")
    p.add_argument("--modes", nargs="+", default=["timed", "dilation"], choices=["timed", "dilation", "plain"])
    p.add_argument("--only", choices=["ratio", "repeat"])
    p.add_argument("--matmul", type=int, default=0, metavar="N",
                   help="also run the ratio test on one N x N x N matmul per step (compute-bound at N = 1024)")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)
    from hal.emulation import timed
    scale = args.scale or timed.DEFAULT_TIME_SCALE
    print(f"timed emulation benchmark: tiny GPT {MODEL}, global batch {GLOBAL_BATCH}; every chip EMULATED on "
          f"this host ({os.cpu_count()} CPUs); time scale {scale:g}; load average {_load()}", flush=True)
    for chip in ("cuda", "ascend"):
        f, b, src = timed.chip_speeds(chip, timed.DEFAULT_DTYPE, scale)
        print(f"  {chip:<7} charged at {f / 1e9:.3g} GFLOP/s, {b / 1e6:.3g} MB/s ({src})", flush=True)
    rows = []
    for n in args.ranks:
        if n % 2:
            raise SystemExit(f"--ranks {n}: must be even (half cuda, half ascend)")
        for mode in args.modes:
            if args.only in (None, "ratio"):
                rows.append(bench_ratio(n, mode, args.warmup, args.steps, scale))
                if args.matmul:
                    rows.append(bench_ratio(n, mode, args.warmup, args.steps, scale, args.matmul))
            if args.only in (None, "repeat"):
                rows.append(bench_repeat(n, mode, args.warmup, args.steps, scale))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
