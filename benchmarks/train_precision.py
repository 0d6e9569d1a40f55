"""bf16 vs fp32 training on timed emulation: tokens/s and peak memory per rank, next to what the chip
catalog's fp32 and bf16 figures predict.

    python -m benchmarks.train_precision [--emulate cuda:2,ascend:2] [--steps 6] [--repeats 3]
                                        [--hidden 256 --layers 4 --seq 128 --batch 8] [--scale 3e5]

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
Prediction from the catalog (hal/data/catalog/*.toml): a compute-bound step scales with 1 / peak FLOP/s
of the dtype, so bf16/fp32 tokens/s = peak_bf16 / peak_fp32 per chip kind where both are known.
Timed emulation charges every op at ONE dtype (HAL_EMULATE_TIMED_DTYPE, default bfloat16) whatever the
op's own dtype (hal/emulation/timed_cost.py: chip_speeds(chip, dtype)), bytes at the tensors' real
sizes, so it cannot show the catalog's fp32/bf16 ratio; the script prints both and says which it saw.
Never pass/fail.
"""
from __future__ import annotations

import argparse
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
    torch.set_num_threads(1)
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
    t.train()
    out = {"rank": t.rank, "chip": t.chips[t.rank]["chip"], "dtype": t.chips[t.rank]["dtype"],
           "state": state[0], "saved": saved[0]}
    if t.rank == 0:
        out.update(t.metrics.summary())
    return out


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


def _prediction(chips: list[str]) -> list[str]:
    from hal.core import catalog
    lines = []
    for chip in dict.fromkeys(chips):
        prof = catalog.default(chip)
        bf, fp = prof.peak("bfloat16"), prof.peak("float32")
        ratio = f"{bf / fp:.1f}x" if bf and fp else "no prediction (fp32 peak unknown in the catalog)"
        lines.append(f"  {chip} ({prof.model}): peak bf16 {bf / 1e12 if bf else float('nan'):.1f} TFLOP/s, fp32 "
                     f"{fp / 1e12 if fp else float('nan'):.1f} TFLOP/s -> bf16/fp32 tokens/s {ratio}")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--emulate", default="cuda:2,ascend:2")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--scale", type=float, default=3e5, help="HAL_EMULATE_TIME_SCALE")
    a = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from benchmarks.train_precision import rank_run as fn  # by module path: the workers import it
    from hal.emulation.emulate import emulated_ranks
    from hal.testing import WorkerPool
    world = len(emulated_ranks(a.emulate) or [])
    env = {"HAL_EMULATE": a.emulate, "HAL_EMULATE_TIMED": "1", "HAL_EMULATE_TIME_SCALE": str(a.scale),
           "OMP_NUM_THREADS": "1"}
    runs: dict[str, list[list[dict]]] = {"fp32": [], "bf16": []}
    with tempfile.TemporaryDirectory() as tmp, WorkerPool(world, env=env) as pool:
        for rep in range(a.repeats):
            for prec in runs:
                cfg = _config(f"{tmp}/{prec}-{rep}", prec, a)
                runs[prec].append(pool.run(fn, cfg, timeout=1800))
    print(f"hal train, timed emulation ({a.emulate}, every chip EMULATED on this host's CPU, time scale "
          f"{a.scale:g}; hidden {a.hidden}, {a.layers} layers, seq {a.seq}, global batch {a.batch}, Plan.even "
          f"ZeRO-2; {a.steps} steps x {a.repeats} repeats, medians)")
    med = statistics.median
    tps = {prec: med(r[0]["tokens_per_s_median"] for r in reps) for prec, reps in runs.items()}
    over = {prec: med(r[0].get("overruns", 0) for r in reps) for prec, reps in runs.items()}
    for prec, reps in runs.items():
        each = ", ".join(f"{r[0]['tokens_per_s_median']:,.1f}" for r in reps)
        print(f"  {prec}: {tps[prec]:,.1f} tokens/s (repeats: {each}; timed-emulation overruns {over[prec]:g})")
        for rank in range(world):
            st, sv = (med(r[rank][k] for r in reps) for k in ("state", "saved"))
            info = reps[0][rank]
            print(f"    rank {rank} {info['chip']:6s} {info['dtype']:8s} peak state {st / 2**20:7.2f} MiB  "
                  f"saved activations {sv / 2**20:7.2f} MiB  total {(st + sv) / 2**20:7.2f} MiB")
    print(f"  measured bf16/fp32 tokens/s: {tps['bf16'] / tps['fp32']:.2f}x")
    print("  catalog prediction for a compute-bound step:")
    print("\n".join(_prediction([c.split(":")[0] for c in a.emulate.split(",")])))
    print("  timed emulation charges every op at HAL_EMULATE_TIMED_DTYPE (one dtype) whatever the op's dtype, so "
          "it predicts ~1x for compute-bound steps; bytes are charged at the tensors' real sizes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
