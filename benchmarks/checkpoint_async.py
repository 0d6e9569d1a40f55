"""How long a `hal train` checkpoint holds the training loop: hal.trainer.checkpoint.Checkpointer with
`dcp.async_save` (the default) against synchronous `dcp.save`, on emulated chips (every chip EMULATED on
this host's CPU; checkpoint files on the local disk).

    python benchmarks/checkpoint_async.py [--emulate cuda:2,ascend:2] [--hidden 256] [--layers 4]
                                          [--repeats 5] [--out /tmp/hal-ckpt-bench]

One WorkerPool of ranks lays a GPT (hal.strategies.models, vocab 256) out as PP 2 x DP 2 (Plan.even), takes
one training step so AdamW has its moments, then saves `--repeats` checkpoints each way. Per save it
measures, on every rank, the seconds `save()` blocks the caller (async: staging the state into CPU memory
and starting the writer thread; sync: the whole write) and, for async, the seconds until the write is
done (`wait()`). Figures: the median over repeats of the slowest rank, and the ratio blocked(sync) /
blocked(async). Never pass/fail.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def rank_case(hidden: int, layers: int, repeats: int, out: str) -> dict:
    """On every rank: build, one step, then time `repeats` async and `repeats` sync saves."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import hal.ccl_bridge  # noqa: F401 - the `hetero` backend
    import hal
    from hal.core.topology import Topology
    from hal.strategies.apply import apply_plan
    from hal.strategies.models import ModelConfig, build_model
    from hal.strategies.plan import Plan
    from hal.trainer.checkpoint import Checkpointer

    if not dist.is_initialized():
        dist.init_process_group("hetero", timeout=timedelta(seconds=120))
    world = dist.get_world_size()
    topo = Topology.from_env(world_size=world)
    cfg = ModelConfig(name="bench", layers=layers, hidden=hidden, heads=8, ffn=4 * hidden, vocab=256, seq=64)
    plan = Plan.even(topo, cfg, 8, 2, pp=2)
    model = build_model(cfg, 0)
    run = apply_plan(model, plan, topo, model_cfg=cfg, timeout=timedelta(seconds=120))
    opt = torch.optim.AdamW(run.parameters(), lr=1e-3, foreach=False)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (8, 64), generator=g)
    run.step(x, torch.roll(x, -1, 1))
    opt.step()
    chips = [{"rank": r, "chip": hal.accelerator().chip.name, "emulated": True} for r in range(world)]
    params = sum(p.numel() for p in model.parameters())
    res: dict = {"params": params, "async_block": [], "async_done": [], "sync_block": []}
    for mode in ("async", "sync"):
        saver = Checkpointer(Path(out) / mode, run, opt, plan, chips, 120.0, use_async=mode == "async")
        for i in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            saver.save(i + 1)
            res[f"{mode}_block"].append(time.perf_counter() - t0)
            if mode == "async":
                saver.wait()
                res["async_done"].append(time.perf_counter() - t0)
        saver.close()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--emulate", default="cuda:2,ascend:2")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="/tmp/hal-ckpt-bench")
    a = ap.parse_args(argv)
    from hal.emulation.emulate import emulated_ranks
    from hal.testing import WorkerPool
    world = len(emulated_ranks(a.emulate, None))
    shutil.rmtree(a.out, ignore_errors=True)
    with WorkerPool(world, env={"HAL_EMULATE": a.emulate, "OMP_NUM_THREADS": "1"}) as pool:
        out = pool.run(rank_case, a.hidden, a.layers, a.repeats, a.out, timeout=600)
    slowest = {k: [max(r[k][i] for r in out) for i in range(a.repeats)] for k in ("async_block", "async_done", "sync_block")}
    med = {k: statistics.median(v) for k, v in slowest.items()}
    size = sum(p.stat().st_size for p in Path(a.out, "sync", "step_00000001").glob("*.distcp"))
    print(f"checkpoint of a GPT with {out[0]['params']:,} parameters (+ AdamW moments, {size / 1e6:.1f} MB on disk), "
          f"PP 2 x DP 2 on {a.emulate} (every chip EMULATED on this host's CPU), median of {a.repeats}, slowest rank:")
    print(f"  sync  dcp.save        blocks the loop {med['sync_block'] * 1e3:8.1f} ms")
    print(f"  async dcp.async_save  blocks the loop {med['async_block'] * 1e3:8.1f} ms   "
          f"(write done after {med['async_done'] * 1e3:.1f} ms, in a background thread)")
    print(f"  blocked time, sync / async: {med['sync_block'] / med['async_block']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
