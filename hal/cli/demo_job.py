"""The training job `hal demo` runs on every rank: the `hal train` Trainer (hal.trainer.trainer) trains a
small GPT (hal.strategies.models, every op through hal.ops) on the byte-level corpus with torch's DDP over
one process group (`hetero` by default; Plan.even: data parallel over every rank), then rank 0 replays
the same model, data and optimizer in one process and prints the loss curve side by side and the max abs
difference of the final parameters.

Run it under torchrun (`hal demo` does that for you, with a temporary run folder):
    HAL_EMULATE=cuda:2,ascend:2 torchrun --nproc-per-node 4 -m hal.cli.demo_job --steps 300 --run-dir runs/demo
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

# the demo's model: a 2-layer GPT on bytes (vocab 256), 32-byte sequences
MODEL = {"name": "demo", "layers": 2, "hidden": 64, "heads": 4, "ffn": 128, "vocab": 256, "seq": 32}
SEED, LR = 0, 3e-3


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m hal.cli.demo_job", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--global-batch", type=int, default=16, help="sequences per step over all ranks")
    p.add_argument("--backend", default="hetero", choices=("hetero", "gloo"))
    p.add_argument("--tolerance", type=float, default=1e-4,
                   help="max abs parameter difference accepted as parity (default 1e-4)")
    p.add_argument("--timeout", type=float, default=120.0, help="collective timeout, seconds")
    p.add_argument("--run-dir", default="runs/demo", help="the trainer's run folder (metrics.jsonl, model.toml)")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"--steps must be >= 1, got {args.steps}")
    return args


def demo_config(steps: int, global_batch: int, run_dir: Path, backend: str = "hetero", timeout_s: float = 120.0):
    """The demo as a `hal train` config: the GPT of MODEL (its TOML written into `run_dir`), the Python
    standard library's bytes, constant lr AdamW, Plan.even (DDP), no checkpoints, no slow-node or slow-link
    findings, progress every tenth."""
    from hal.trainer.config import TrainConfig
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    model = run_dir / "model.toml"
    tmp = run_dir / f".model.{os.getpid()}.toml"  # every rank writes the same file: atomically
    tmp.write_text("".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in MODEL.items()))
    tmp.replace(model)
    return TrainConfig(seed=SEED, steps=steps, global_batch=global_batch, backend=backend, timeout_s=timeout_s,
                       model={"path": str(model)}, data={"max_bytes": 1 << 20},
                       optimizer={"lr": LR, "warmup_steps": 0, "min_lr_ratio": 1.0},
                       plan={"source": "even"}, checkpoint={"enabled": False},
                       # steps of milliseconds on a shared CPU: its jitter is no slow node or link to report
                       slow_node={"threshold": 1e3, "link_threshold": 1e3},
                       log={"dir": str(run_dir), "val_interval": 0, "val_batches": 1,
                            "print_interval": max(1, steps // 10)})


def flat(params: dict[str, torch.Tensor]) -> torch.Tensor:
    """Every parameter, flattened in name order (the same order for the trainer's and the replay's)."""
    return torch.cat([params[n].detach().reshape(-1) for n in sorted(params)])


def replay(cfg, corpus, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """The same model, data, optimizer and lr schedule in one process, the whole global batch per step with
    its mean loss: (final parameters flattened, loss per step)."""
    import hal.ops as ops
    from hal.strategies.models import IGNORE_INDEX, build_model, count_tokens
    from hal.trainer.data import train_batch
    from hal.trainer.trainer import build_optimizer
    model_cfg = cfg.load_model_config()
    model = build_model(model_cfg, cfg.seed).to(dtype)
    opt = build_optimizer(cfg, list(model.parameters()))
    losses = []
    for step in range(cfg.last_step):
        for group in opt.param_groups:
            group["lr"] = cfg.lr_at(step)
        x, y = train_batch(corpus, cfg.seed, step, cfg.global_batch, model_cfg.seq)
        logits = model(x)
        loss = ops.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), IGNORE_INDEX, "sum")
        loss = loss / count_tokens(y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return flat(dict(model.named_parameters())), torch.tensor(losses)


def float32_floor(flat_dist: torch.Tensor, ref_flat: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
    """(max |distributed - exact|, max |single process - exact|), exact = the float64 replay.

    Why: AdamW's step is lr * m / (sqrt(v) + eps), about lr * sign(g) whatever |g| is, so an element
    whose gradient nearly cancels (|g| ~ 1e-8..1e-7, common with 1 sequence per rank) turns float32's
    rounding of the sum (~u * sum|partials|, u = 6e-8) into a visible change of its update; the
    distributed run sums in another order than the single process, so both sit at float32's distance
    from the exact result, which can exceed a fixed tolerance for the single process itself."""
    exact = exact.double()
    return (flat_dist.double() - exact).abs().max().item(), (ref_flat.double() - exact).abs().max().item()


def parity_ok(diff: float, tolerance: float, floor=None) -> bool:
    """Parity: within `tolerance` of the single process, or, when float32 rounding alone is larger
    than that, no further from the float64 result than twice the single float32 process is."""
    if diff <= tolerance:
        return True
    if floor is None:
        return False
    dist_err, single_err = floor
    return dist_err <= max(tolerance, 2.0 * single_err)


def _train(args) -> dict:
    """Every rank: the Trainer's run of the demo config; returns what rank 0 reports."""
    import hal
    from hal.trainer.console import setup_console
    from hal.trainer.trainer import Trainer
    cfg = demo_config(args.steps, args.global_batch, Path(args.run_dir), args.backend, args.timeout)
    trainer = Trainer(cfg, report=False)  # joins the process group, lays the model out (DDP), builds AdamW
    rank, world = trainer.rank, trainer.world
    acc = hal.accelerator()
    chips: list = [None] * world
    dist.all_gather_object(chips, (acc.chip.name, acc.emulated, acc.plugin, str(acc.device)), group=trainer.book)
    if rank == 0:
        mc = trainer.model_cfg
        print(f"  process group: backend {dist.get_backend()!r}, {world} ranks; model {mc.num_params():,} "
              f"parameters (GPT: {mc.layers} layers, hidden {mc.hidden}); global batch {cfg.global_batch} x "
              f"{mc.seq} bytes of {trainer.corpus.source}; AdamW lr {LR}\n"
              f"  progress: the step's loss (mean over the global batch), every {cfg.log.print_interval} steps",
              flush=True)
        setup_console()  # the trainer's progress lines, from here on
    t0 = time.perf_counter()
    result = trainer.train()
    train_s = time.perf_counter() - t0
    mine = flat(trainer.run.full_parameters())
    ref0 = mine.clone()  # DDP keeps replicas equal: check it, every rank against rank 0's copy
    dist.broadcast(ref0, src=0)
    spread = torch.tensor([(mine - ref0).abs().max().item()])
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    dist.destroy_process_group()  # hetero included: tests/test_hetero_destroy.py holds that it exits cleanly
    return {"rank": rank, "cfg": cfg, "corpus": trainer.corpus, "chips": chips, "flat": mine,
            "losses": torch.tensor(result["losses"]), "spread": spread.item(), "train_s": train_s}


def main(argv=None) -> int:
    args = parse(argv)
    run = _train(args)
    if run["rank"] != 0:
        return 0
    print(f"  trained {args.steps} steps in {run['train_s']:.1f} s; replaying them in one process for parity ...",
          flush=True)
    t1 = time.perf_counter()
    ref_flat, ref_losses = replay(run["cfg"], run["corpus"])
    ref_s = time.perf_counter() - t1
    diff = (run["flat"] - ref_flat).abs().max().item()
    from hal.strategies.models import build_model
    init = flat(dict(build_model(run["cfg"].load_model_config(), run["cfg"].seed).named_parameters()))
    moved = (ref_flat - init).abs().max().item()
    floor = None
    if diff > args.tolerance:
        print(f"  |diff| {diff:.2e} > tolerance {args.tolerance:g}: replaying in float64 to measure float32's "
              f"own rounding on this run ...", flush=True)
        floor = float32_floor(run["flat"], ref_flat, replay(run["cfg"], run["corpus"], torch.float64)[0])
    ok = parity_ok(diff, args.tolerance, floor)
    report(args, run, ref_losses, diff, moved, ref_s, floor, ok)
    return 0 if ok else 1


def report(args, run: dict, ref_losses, diff, moved, ref_s, floor=None, ok=None) -> None:
    losses, vocab = run["losses"], MODEL["vocab"]
    steps = len(losses)
    marks = sorted({1, *[max(1, round(steps * f)) for f in (0.1, 0.25, 0.5, 0.75)], steps})
    print(f"\nloss curve (mean next-byte cross entropy over the global batch; uniform guess = "
          f"ln {vocab} = {math.log(vocab):.3f}):")
    print(f"  {'step':>6}  {args.backend + ' DDP':>12}  {'1 process':>10}  {'|diff|':>8}")
    for s in marks:
        a, b = losses[s - 1].item(), ref_losses[s - 1].item()
        print(f"  {s:>6}  {a:>12.4f}  {b:>10.4f}  {abs(a - b):>8.1e}")
    tail = max(1, steps // 10)
    print(f"  loss fell {losses[:tail].mean():.3f} -> {losses[-tail:].mean():.3f} (mean of the first and "
          f"last {tail} steps); max |loss diff| over all {steps} steps {(losses - ref_losses).abs().max():.1e}")
    ok = diff <= args.tolerance if ok is None else ok
    n_params = run["flat"].numel()
    print(f"\nparity with a single-process run of the same model and data ({n_params:,} parameters):")
    print(f"  max |{args.backend} DDP - single process| over final parameters = {diff:.2e} "
          f"(tolerance {args.tolerance:g}; parameters moved up to {moved:.2e} from init)  "
          f"{('PARITY OK' if ok else 'PARITY FAILED') if floor is None else 'above tolerance:'}")
    if floor is not None:
        print(f"  float32 rounding on this run (vs a float64 replay): single process {floor[1]:.2e}, "
              f"{args.backend} DDP {floor[0]:.2e}; parity holds when DDP is within max(tolerance, 2 x single "
              f"process) = {max(args.tolerance, 2 * floor[1]):.2e}  {'PARITY OK' if ok else 'PARITY FAILED'}")
    print(f"  replicas agree across ranks: max |rank r - rank 0| = {run['spread']:.1e}")
    print(f"  wall time: {run['train_s']:.1f} s distributed, {ref_s:.1f} s single process")
    print("\nranks (chip each rank ran):")
    for r, (chip, emulated, plugin, device) in enumerate(run["chips"]):
        how = "EMULATED on this host's CPU" if emulated else f"native, {device}"
        print(f"  rank {r}: {chip:<7} plugin {plugin:<10} {how}")


def entry(argv=None) -> int:
    """main(), with an uncaught error reported as one marked line for the launcher (`hal demo` prints
    the first failing rank's line once; the traceback stays in the ranks' log)."""
    try:
        return main(argv)
    except Exception as exc:
        from hal.launch.check import report_rank_failure
        report_rank_failure(exc)
        raise


if __name__ == "__main__":
    sys.exit(entry())
