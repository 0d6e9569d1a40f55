"""Per-call cost of `hal.ops` dispatch: hal.ops.X versus calling the selected kernel directly (what a
user would otherwise write) and versus the reference kernel directly.

    python -m benchmarks.dispatch [--chip cpu] [--emulated] [--calls 2000] [--repeats 7]

Tensors are tiny so that the call overhead shows rather than the arithmetic. Each variant is timed
--repeats x --calls times in samples of 50 calls, the variants taking turns sample by sample (the
machine is shared and noisy: a burst of load then hits every variant alike); the table shows the
median per call, and "overhead" the median of the paired differences hal.ops - selected, sample by
sample, with +- half their interquartile range (the noise). The "dispatch floor" row binds a no-op kernel (through a
throwaway plugin of priority 1000) so that nothing but the dispatch is timed. Target: < 1 µs.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import timeit
from types import SimpleNamespace
from typing import Callable

import torch

import hal
from hal.ops import reference


def _inputs() -> dict[str, tuple]:
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    cos, sin = torch.ones(4, 8), torch.zeros(4, 8)
    return {
        "silu": (r(8),),
        "gelu": (r(8),),
        "softmax": (r(4, 8),),
        "rms_norm": (r(4, 8), torch.ones(8)),
        "layer_norm": (r(4, 8), torch.ones(8), torch.zeros(8)),
        "linear": (r(4, 8), r(8, 8), r(8)),
        "matmul": (r(4, 8), r(8, 4)),
        "swiglu": (r(4, 8),),
        "rotary_embedding": (r(4, 8), cos, sin),
        "embedding": (torch.tensor([1, 2, 3]), r(16, 8)),
        "scaled_dot_product_attention": (r(1, 1, 4, 8), r(1, 1, 4, 8), r(1, 1, 4, 8)),
    }


CHUNK = 50  # calls per sample; the variants take turns sample by sample


def _time(fns: dict[str, Callable], args: tuple, calls: int, repeats: int) -> dict[str, list[float]]:
    """ns per call of each fn: repeats x (calls / CHUNK) samples of CHUNK calls, the variants taking
    turns sample by sample, so that load from other processes hits them alike and a pre-empted sample
    is an outlier the median ignores."""
    timers = {name: timeit.Timer("f(*a)", globals={"f": fn, "a": args}) for name, fn in fns.items()}
    for t in timers.values():
        t.timeit(CHUNK)  # warm up
    samples: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for i in range(repeats * max(1, calls // CHUNK)):
        k = i % len(names)
        for name in names[k:] + names[:k]:  # rotate who goes first: no order bias
            samples[name].append(timers[name].timeit(CHUNK) / CHUNK * 1e9)
    return samples


def _overhead(a: list[float], b: list[float]) -> tuple[float, float]:
    """Median of the paired differences a - b, and half their interquartile range (the noise)."""
    d = sorted(x - y for x, y in zip(a, b))
    q1, q3 = d[len(d) // 4], d[(3 * len(d)) // 4]
    return statistics.median(d), (q3 - q1) / 2


def _ns(x: float) -> str:
    return f"{x / 1000:.2f} µs" if abs(x) >= 1000 else f"{x:.0f} ns"


def _noop_plugin() -> SimpleNamespace:
    def noop_silu(x):
        return x

    ns = SimpleNamespace(__name__="bench_noop")
    ns.hal_plugin_info = hal.hookimpl(lambda: hal.PluginInfo(name="bench_noop", version="0",
                                                             contract_version=hal.CONTRACT_VERSION))
    ns.hal_chips = hal.hookimpl(lambda: [])
    ns.hal_op_kernels = hal.hookimpl(lambda chip, emulated: [hal.OpKernel("silu", noop_silu, priority=1000,
                                                                          name="noop")])
    return ns


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chip", default="cpu", help="chip to bind (default cpu)")
    p.add_argument("--emulated", action="store_true", help="bind the chip emulated")
    p.add_argument("--calls", type=int, default=2000, help="calls per timing (default 2000; x20 for the floor)")
    p.add_argument("--repeats", type=int, default=7, help="timings per variant; the median is shown (default 7)")
    args = p.parse_args(argv)
    if args.calls < 1 or args.repeats < 1:
        p.error(f"--calls {args.calls} and --repeats {args.repeats} must be >= 1")
    torch.set_num_threads(1)  # tiny tensors: threads only add noise

    acc = hal.bind(args.chip, emulated=args.emulated)
    tag = "EMULATED" if acc.emulated else "native"
    print(f"hal.ops dispatch overhead, chip {acc.chip.name} ({tag}), torch {torch.__version__}, "
          f"Python {platform.python_version()}, median of {args.repeats} repeats x {args.calls} calls")
    head = (f"{'op':<29} {'hal.ops':>9} {'selected':>9} {'reference':>9} {'overhead':>9} {'+-':>7} "
            f"{'vs sel':>6} {'vs ref':>6}  selected kernel")
    print(head)
    print("-" * len(head))
    overheads: list[float] = []
    with torch.no_grad():
        for op, a in _inputs().items():
            kernel = acc.kernels[op]
            s = _time({"hal": getattr(hal.ops, op), "sel": kernel.fn, "ref": reference.KERNELS[op]},
                      a, args.calls, args.repeats)
            med = {k: statistics.median(v) for k, v in s.items()}
            over, noise = _overhead(s["hal"], s["sel"])
            overheads.append(over)
            print(f"{op:<29} {_ns(med['hal']):>9} {_ns(med['sel']):>9} {_ns(med['ref']):>9} {_ns(over):>9} "
                  f"{_ns(noise):>7} {med['hal'] / med['sel']:>6.2f} {med['hal'] / med['ref']:>6.2f}  "
                  f"{kernel.describe()}")

        # Nothing but dispatch: a no-op kernel bound through a throwaway plugin.
        pm = hal.get_plugin_manager()
        import hal_cpu
        fresh = hal.PluginManager()
        fresh.register(hal_cpu)
        fresh.register(_noop_plugin())
        hal.bind("cpu", pm=fresh)
        noop = hal.ops.bound_kernels()["silu"].fn
        x = torch.zeros(1)
        s = _time({"hal": hal.ops.silu, "sel": noop}, (x,), args.calls * 20, args.repeats)
        floor, noise = _overhead(s["hal"], s["sel"])
        print(f"{'dispatch floor (no-op kernel)':<29} {_ns(statistics.median(s['hal'])):>9} "
              f"{_ns(statistics.median(s['sel'])):>9} {'':>9} {_ns(floor):>9} {_ns(noise):>7} "
              f"{statistics.median(s['hal']) / statistics.median(s['sel']):>6.2f}")
        hal.set_plugin_manager(pm)
        hal.reset()
    typical = statistics.median(overheads)
    verdict = "met" if floor < 1000 and typical < 1000 else "NOT met"
    print(f"\ntarget: dispatch overhead < 1 µs per call -> {verdict}: {_ns(floor)} with a no-op kernel, "
          f"median over the ops {_ns(typical)} (range {_ns(min(overheads))} .. {_ns(max(overheads))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
