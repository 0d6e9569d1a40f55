"""Activation memory of one GPT block: what autograd really keeps for backward versus
`ModelConfig.activation_bytes` (REFERENCE.md's estimate, which the planner prices memory with).

    python benchmarks/activation_memory.py [--hidden 512] [--heads 8] [--ffn 1376] [--seq 512] [--batch 2]

One block of hal.strategies.models.GPT runs forward in bf16 through the bound hal.ops kernels (this host's
chip; on a machine without an accelerator that is the CPU) under torch.autograd.graph.saved_tensors_hooks;
the bytes of every distinct storage saved for backward are summed (a tensor saved twice counts once;
the block's weights are excluded). Then the same with the block under torch.utils.checkpoint (full
recompute), where only the block input should stay. Bytes, not time: deterministic, no repeats needed.
"""
from __future__ import annotations

import argparse

import torch
from torch.utils.checkpoint import checkpoint

import hal
from hal.strategies.models import ModelConfig, build_model


def saved_bytes(fn, x: torch.Tensor, exclude: set) -> int:
    """Bytes of distinct storages autograd saves while running fn(x) (those in `exclude` left out)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        st = t.untyped_storage()
        if st.data_ptr() not in exclude:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(x)
    del out
    return sum(seen.values())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--ffn", type=int, default=1376)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=2)
    args = p.parse_args(argv)
    acc = hal.accelerator()
    cfg = ModelConfig(name="bench", layers=1, hidden=args.hidden, heads=args.heads, ffn=args.ffn, vocab=128,
                      seq=args.seq)
    model = build_model(cfg).to(device=acc.device, dtype=torch.bfloat16)
    block = model.blocks[0]
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    weights |= {b.untyped_storage().data_ptr() for b in model.buffers()}
    x = torch.randn(args.batch, args.seq, args.hidden, device=acc.device, dtype=torch.bfloat16, requires_grad=True)
    cos, sin = model.rope_cos, model.rope_sin

    def plain(t):
        return block(t, cos, sin)

    def recomputed(t):
        return checkpoint(block, t, cos, sin, use_reentrant=False)

    measured = saved_bytes(plain, x, weights)
    measured_full = saved_bytes(recomputed, x, weights)
    est = cfg.activation_bytes(args.batch)
    est_fused = cfg.activation_bytes(args.batch, attention="fused")
    est_full = cfg.activation_bytes(args.batch, recompute="full")
    sbh = args.seq * args.batch * args.hidden
    kinds = {op: k.describe() for op, k in hal.ops.bound_kernels().items()
             if op in ("scaled_dot_product_attention", "rms_norm", "linear", "silu")}
    print(f"chip {acc.chip.name} ({'emulated' if acc.emulated else 'native'}, {acc.device}); one block, bf16, "
          f"h={args.hidden} a={args.heads} ffn={args.ffn} s={args.seq} b={args.batch} (s*b*h = {sbh:,})")
    for op, k in kinds.items():
        print(f"  kernel {op}: {k}")
    print("  bytes per s*b*h element: measured, then ModelConfig.activation_bytes (REFERENCE's estimate)")
    print(f"  no recompute:   measured {measured / sbh:6.1f}  estimate {est / sbh:6.1f} (materialized "
          f"attention), {est_fused / sbh:6.1f} (fused)  -> measured/estimate {measured / est:.2f} / "
          f"{measured / est_fused:.2f}   [{measured / 2**20:.2f} MiB measured]")
    print(f"  full recompute: measured {measured_full / sbh:6.1f}  estimate {est_full / sbh:6.1f}  -> "
          f"{measured_full / est_full:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
