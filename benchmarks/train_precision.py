"""bf16 vs fp32 training on timed emulation: tokens/s and peak memory per rank, next to what the chip
catalog's fp32 and bf16 figures predict.

    python -m benchmarks.train_precision [--emulate cuda:2,ascend:2] [--steps 4] [--repeats 2]
                                        [--hidden 2048 --layers 1 --seq 256 --batch 8] [--scale 2e4]
                                        [--timed-dtype ascend:float32=bfloat16] [--threads 1]

Every chip is EMULATED on this host's CPU with TIMED emulation (HAL_EMULATE_TIMED=1, hal.emulation.timed:
each op is charged to a virtual clock from its FLOPs and bytes at the chip's catalog speed x the time
scale; communication is the host's real CPU fabric). For each precision (`[train] precision` fp32, then
bf16) and each repeat, one `hal train` run of the same config (Plan.even, DP over all ranks, ZeRO-2,
one micro-batch) in one worker pool; per repeat tokens/s is the run's median over its steps after the
first (hal.trainer.metrics), and the figure printed is the median over repeats. Peak memory per rank,
measured on the rank (median over repeats):
  state  bytes of parameter, gradient and AdamW-state storage it holds after a step (before zero_grad)
  saved  bytes of the tensors autograd saved for backward during one step (saved_tensors_hooks, each
         storage once: the activations; one micro-batch, so all of them are alive at once)
Timed emulation charges each op at the rate of the dtype it computes in (hal/emulation/timed_cost.py:
`Speeds.rates`, peak(dtype) x the efficiency matrix's best fraction), bytes at the tensors' real sizes.
A chip whose catalog has no float32 figure (the 910B2) refuses float32 ops, so the fp32 run needs an
explicit re-mapping, `--timed-dtype` (HAL_EMULATE_TIMED_DTYPE; default 'ascend:float32=bfloat16': the
910B2's float32 matmuls at its bf16 Cube rate, an assumption printed with the figures).
Prediction from the catalog (hal/data/catalog/*.toml): a compute-bound step scales with 1 / FLOP/s of the
dtype, so per chip kind bf16/fp32 tokens/s = peak_bf16 / peak_fp32; for the cluster (Plan.even: every
rank the same rows, the step waits for the slowest) = max over ranks of 1 / F_fp32 over max of 1 / F_bf16,
F the rate each rank's clock charges. Each rank's `compute share` = its FLOPs / F(dtype) over its clock's
busy time (1.0: every charged second was matmul compute; the rest is bytes-bound ops).
Never pass/fail.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _config(run_dir: str, precision: str, a) -> dict:
    return {"seed": 0, "steps": a.steps, "global_batch": a.batch, "backend": "hetero", "timeout_s": 600,
            "model": {"path": str(ROOT / "examples/models/tiny.toml"),
                      "overrides": {"vocab": 256, "seq": a.seq, "hidden": a.hidden, "heads": a.hidden // 32,
                                    "ffn": a.hidden * 8 // 3 // 8 * 8, "layers": a.layers}},
            "data": {"max_bytes": 1 << 20}, "optimizer": {"warmup_steps": 1},
            "plan": {"source": "even", "zero": 2}, "checkpoint": {"enabled": False},
            "train": {"precision": precision}, "efficiency": {"skip": 1},
            "log": {"dir": run_dir, "val_interval": 0, "val_batches": 1}}


def rank_run(config: dict) -> dict:
    """One rank: a `hal train` run (Trainer) with its memory measured; the figures this script prints."""
    import torch

    from hal.trainer.config import TrainConfig
    from hal.trainer.trainer import Trainer
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    t = Trainer(TrainConfig(**config), report=False)
    seen: set = set()
    saved = [0]

    def pack(x):
        st = x.untyped_storage()
        if st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            saved[0] += st.nbytes()
        return x

    state = [0]
    step_fn = t.optimizer.step if t.optimizer is not None else None

    def measured_step(*args, **kwargs):  # params, gradients and AdamW state just before zero_grad
        out = step_fn(*args, **kwargs)
        state[0] = max(state[0], _state_bytes(t.params, t.optimizer))
        return out

    if t.optimizer is not None:
        t.optimizer.step = measured_step
    first = t.train_step
    done = [False]

    def train_step(step):  # count the saved tensors of the first step only (one micro-batch: all alive)
        if done[0]:
            return first(step)
        done[0] = True
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            return first(step)

    t.train_step = train_step
    from hal.emulation import timed
    clock = timed.active_clock()
    if clock is not None:
        clock.reset_stats()
    t.train()
    out = {"rank": t.rank, "chip": t.chips[t.rank]["chip"], "dtype": t.chips[t.rank]["dtype"],
           "state": state[0], "saved": saved[0], "compute_share": _compute_share(clock, t.chips[t.rank]["dtype"])}
    if t.rank == 0:
        out.update(t.metrics.summary())
    return out


def _compute_share(clock, dtype: str) -> float:
    """FLOPs / F(dtype) over the clock's busy seconds since reset (NaN without timed emulation)."""
    if clock is None:
        return float("nan")
    st = clock.stats()
    return st["flops"] / clock.speeds.flops_for(dtype) / st["busy_s"] if st["busy_s"] else float("nan")


def _state_bytes(params, opt) -> int:
    import torch
    from torch.distributed.tensor import DTensor
    seen, total = set(), 0
    tensors = list(params) + [p.grad for p in params] + \
        [v for p in params for v in opt.state.get(p, {}).values() if torch.is_tensor(v)]
    for x in tensors:
        if x is None:
            continue
        local = x._local_tensor if isinstance(x, DTensor) else x
        st = local.untyped_storage()
        if st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            total += st.nbytes()
    return total


def _prediction(emulate: str, remap: str) -> list[str]:
    """What the catalog predicts for a compute-bound step: per chip kind, and for the cluster under Plan.even."""
    from hal.core import catalog
    from hal.emulation import timed
    from hal.emulation.emulate import emulated_ranks
    lines, slowest = [], {"float32": 0.0, "bfloat16": 0.0}
    for chip in emulated_ranks(emulate) or []:
        prof = catalog.default(chip)
        sp = timed.chip_speeds(prof, None, 1.0, charge_as=timed.charge_plan(remap, chip, prof.model)[1])
        for d in slowest:
            slowest[d] = max(slowest[d], 1.0 / sp.flops_for(d, "matmul"))
        if any(line.startswith(f"  {chip} ") for line in lines):
            continue
        bf, fp = prof.peak("bfloat16"), prof.peak("float32")
        ratio = f"{bf / fp:.1f}x" if bf and fp else "none (fp32 peak unknown in the catalog)"
        lines.append(f"  {chip} ({prof.model}): catalog peak bf16 {bf / 1e12 if bf else float('nan'):.1f} TFLOP/s, "
                     f"fp32 {fp / 1e12 if fp else float('nan'):.1f} TFLOP/s -> bf16/fp32 tokens/s {ratio}; charged "
                     f"F bf16 {sp.flops_for('bfloat16') / 1e12:.1f}, fp32 {sp.flops_for('float32') / 1e12:.1f} "
                     f"TFLOP/s ({sp.source.split('; ')[-1] if remap and 'charged as' in sp.source else 'no re-mapping'})")
    lines.append(f"  cluster {emulate}, Plan.even, compute-bound: slowest rank fp32 / slowest rank bf16 = "
                 f"{slowest['float32'] / slowest['bfloat16']:.2f}x")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--emulate", default="cuda:2,ascend:2")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--scale", type=float, default=2e4, help="HAL_EMULATE_TIME_SCALE")
    p.add_argument("--timed-dtype", default="ascend:float32=bfloat16", help="HAL_EMULATE_TIMED_DTYPE")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    a = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from benchmarks.train_precision import rank_run as fn  # by module path: the workers import it
    from hal.emulation.emulate import emulated_ranks
    from hal.testing import WorkerPool
    world = len(emulated_ranks(a.emulate) or [])
    env = {"HAL_EMULATE": a.emulate, "HAL_EMULATE_TIMED": "1", "HAL_EMULATE_TIME_SCALE": str(a.scale),
           "OMP_NUM_THREADS": str(a.threads), "HAL_EMULATE_TIMED_DTYPE": a.timed_dtype}
    runs: dict[str, list[list[dict]]] = {"fp32": [], "bf16": []}
    with tempfile.TemporaryDirectory() as tmp, WorkerPool(world, env=env) as pool:
        for rep in range(a.repeats):
            for prec in runs:
                cfg = _config(f"{tmp}/{prec}-{rep}", prec, a)
                runs[prec].append(pool.run(fn, cfg, timeout=1800))
    print(f"hal train, timed emulation ({a.emulate}, every chip EMULATED on this host's CPU, time scale "
          f"{a.scale:g}; HAL_EMULATE_TIMED_DTYPE={a.timed_dtype!r}; hidden {a.hidden}, {a.layers} layers, seq "
          f"{a.seq}, global batch {a.batch}, Plan.even ZeRO-2; {a.steps} steps x {a.repeats} repeats, medians; "
          f"host load {' '.join(f'{x:.1f}' for x in os.getloadavg())})")
    med = statistics.median
    tps = {prec: med(r[0]["tokens_per_s_median"] for r in reps) for prec, reps in runs.items()}
    over = {prec: med(r[0].get("overruns", 0) for r in reps) for prec, reps in runs.items()}
    share = {prec: med(r[0].get("overrun_share", 0.0) for r in reps) for prec, reps in runs.items()}
    for prec, reps in runs.items():
        each = ", ".join(f"{r[0]['tokens_per_s_median']:,.1f}" for r in reps)
        print(f"  {prec}: {tps[prec]:,.1f} tokens/s (repeats: {each}; timed-emulation overruns {over[prec]:g}, "
              f"host-bound share of the measured steps' compute time {share[prec]:.1%})")
        for rank in range(world):
            st, sv, cs = (med(r[rank][k] for r in reps) for k in ("state", "saved", "compute_share"))
            info = reps[0][rank]
            print(f"    rank {rank} {info['chip']:6s} {info['dtype']:8s} peak state {st / 2**20:8.2f} MiB  "
                  f"saved activations {sv / 2**20:8.2f} MiB  total {(st + sv) / 2**20:8.2f} MiB  "
                  f"compute share {cs:.2f}")
    print(f"  measured bf16/fp32 tokens/s: {tps['bf16'] / tps['fp32']:.2f}x")
    print("  catalog prediction for a compute-bound step (each op charged at its dtype's rate):")
    print("\n".join(_prediction(a.emulate, a.timed_dtype)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
