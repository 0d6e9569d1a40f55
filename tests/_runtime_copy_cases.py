"""Rank-side cases of tests/test_planner_runtime_copies.py: the bytes of the copies the runtime's
wrappers add (DDP's bucket copies, FSDP2's gather / reduce-scatter packing, sequence-parallel TP's
re-layout cats), counted op by op with hal.emulation.timed.record_ops (what timed emulation charges)."""
from __future__ import annotations

from collections import Counter
from datetime import timedelta

CFG = dict(name="copies", layers=4, hidden=64, heads=4, ffn=128, vocab=256, seq=32)
ROWS = 2
M = 3          # micro-batches per step


def init() -> int:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    return dist.get_rank()


def _stage(lo: int, hi: int, first: bool, last: bool):
    from hal.strategies.apply import StageModule
    from hal.strategies.models import ModelConfig, build_model
    cfg = ModelConfig(**CFG)
    return cfg, StageModule(build_model(cfg, 0), (lo, hi), first, last, "none")


def _inputs(cfg, first: bool):
    import torch
    g = torch.Generator().manual_seed(0)
    if first:
        return torch.randint(0, cfg.vocab, (ROWS, cfg.seq), generator=g)
    return torch.randn(ROWS, cfg.seq, cfg.hidden, generator=g, requires_grad=True)


def _bytes(ops, names) -> float:
    return float(sum(b for n, _, b in ops if n in names))


def _micro_batches(mod, x, forward_ctx, backward_ctx, names) -> list[tuple[float, float]]:
    """(forward bytes, backward bytes) of ops in `names` per micro-batch of one step (after a warm-up
    step, gradients cleared between steps as the trainer does)."""
    from hal.emulation import timed
    out = []
    for step in range(2):
        for p in mod.parameters():
            p.grad = None
        out = []
        for j in range(M):
            last = j == M - 1
            box = {}

            def fwd():
                with forward_ctx(last):
                    box["y"] = mod(x)

            def bwd():
                with backward_ctx(last):
                    box["y"].float().pow(2).mean().backward()
            f, b = timed.record_ops(fwd), timed.record_ops(bwd)
            out.append((_bytes(f, names), _bytes(b, names)))
    return out


def ddp_copies() -> dict:
    """A DDP stage (apply_plan's wrap_ddp, SUM hook, 1 MB buckets) driven like HeteroPipeline:
    no_sync except the last micro-batch's backward. copy_ bytes per micro-batch and P."""
    from contextlib import nullcontext

    from hal.strategies.data_parallel import wrap_ddp
    cfg, st = _stage(1, 3, False, False)
    ddp = wrap_ddp(st, None, bucket_cap_mb=1.0, sum_gradients=True)
    x = _inputs(cfg, False)
    dense = sum(p.numel() * p.element_size() for p in st.parameters())
    per_mb = _micro_batches(ddp, x, lambda last: nullcontext() if last else ddp.no_sync(),
                            lambda last: nullcontext() if last else ddp.no_sync(), {"copy_"})
    buffers = sum(b.numel() * b.element_size() for b in st.buffers())
    return {"dense": dense, "buffers": buffers, "per_mb": per_mb}


def fsdp_copies(zero: int, first: bool, last: bool) -> dict:
    """An FSDP2 stage as apply_plan builds it (hal.strategies.sharded_data_parallel.shard_fsdp2: each block
    one unit, the stage the root) driven like HeteroPipeline's backward (set_requires_gradient_sync /
    set_reshard_after_backward / set_is_last_backward on the last micro-batch only)."""
    from contextlib import contextmanager, nullcontext

    from hal.strategies.sharded_data_parallel import mesh_from_group, shard_fsdp2
    lo, hi = (0, 2) if first else (2, 4)
    cfg, st = _stage(lo, hi, first, last)
    dense = sum(p.numel() * p.element_size() for p in st.parameters())
    ends = sum(p.numel() * p.element_size() for n, p in st.named_parameters() if not n.startswith("blocks."))
    mod = shard_fsdp2(st, st.blocks.values(), mesh_from_group(None), zero=zero, sum_gradients=True)
    x = _inputs(cfg, first)

    @contextmanager
    def bwd_ctx(last_mb):
        mod.set_is_last_backward(last_mb)
        mod.set_requires_gradient_sync(last_mb)
        mod.set_reshard_after_backward(last_mb)
        yield
    names = {"all_gather_copy_in", "split_with_sizes_copy", "chunk_cat"}
    per_mb = _micro_batches(mod, x, lambda last_mb: nullcontext(), bwd_ctx, names)
    return {"dense": dense, "ends": ends, "per_mb": per_mb}


def sp_cats(n_layers: int) -> dict:
    """A sequence-parallel TP stage over the world (hal.strategies.tensor_parallel.apply_tp): the `cat`s of
    the whole (rows, seq, hidden) activation in one forward and one backward, and that size."""
    import torch.distributed as dist

    from hal.emulation import timed
    from hal.strategies.tensor_parallel import apply_tp
    cfg, st = _stage(1, 1 + n_layers, False, False)
    apply_tp(st, dist.group.WORLD, sequence_parallel=True, check_kernels=False)
    x = _inputs(cfg, False)
    full = ROWS * cfg.seq * cfg.hidden * x.element_size()
    box = {}

    def fwd():
        box["y"] = st(x)

    def bwd():
        box["y"].float().pow(2).mean().backward()
    fwd()
    bwd()     # warm-up
    f, b = timed.record_ops(fwd), timed.record_ops(bwd)
    whole = Counter()
    for tag, ops in (("fwd", f), ("bwd", b)):
        whole[tag] = sum(1 for n, _, nb in ops if n == "cat" and nb == 2 * full)
    return {"fwd": whole["fwd"], "bwd": whole["bwd"], "full": full}
