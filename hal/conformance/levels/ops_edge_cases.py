"""Edge-case inputs the conformance ops level adds to `hal.ops.golden`'s cases: empty and large.

`hal.ops.golden.cases` covers odd sizes, non-contiguous views and each op's options; this adds a `range`
case per op where inputs far from order 1 stay within the tolerance table (see `range_cases`). A vendor
kernel also meets empty batches (a rank with no tokens after routing, a pipeline stage's empty
micro-batch) and large rows (hidden 4096, vocab chunks), where tiling and reduction-tree bugs show.
"Large" stays within the tolerance table's MAX_REDUCTION (4096): reductions are at most 4096 long, and
inputs are scaled so outputs are of order 1, as the table assumes. Sizes are odd where the op allows, to
hit remainder tiles. Cases are `hal.ops.golden.OpCase`s, so the golden and the comparison are A's.
"""
from __future__ import annotations

import zlib
from typing import Callable

import torch

from hal.ops.golden import OpCase


def _g(op: str, name: str, seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(f"hal/conformance/{op}/{name}/{seed}".encode()))


def _r(g, shape, d, dev, scale=1.0, shift=0.0):
    return (torch.randn(tuple(shape), generator=g) * scale + shift).to(device=dev, dtype=d)


def _case(op: str, name: str, d: torch.dtype, seed: int, make: Callable, mutates=()) -> OpCase:
    return OpCase(op, name, d, lambda dev: make(_g(op, name, seed), torch.device(dev)), mutates)


def _adamw(d, shapes, t, scale=1.0):
    hyper = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1)

    def make(g, dev):
        p = [_r(g, s, d, dev) for s in shapes]
        gr = [_r(g, s, d, dev, scale) for s in shapes]
        m = [_r(g, s, d, dev, 0.1 * scale) for s in shapes]
        v = [_r(g, s, d, dev, 0.1 * scale).square() for s in shapes]
        return (p, gr, m, v, t), dict(hyper)
    return make


def edge_cases(op: str, d: torch.dtype, seed: int = 0, large: bool = True) -> list[OpCase]:
    """Empty and (with `large`) large cases of `op` in dtype `d`."""
    K = 1023  # odd reduction length, under MAX_REDUCTION
    H = 4095  # long normalisation row
    out: dict[str, list[OpCase]] = {
        "linear": [
            _case(op, "empty_batch", d, seed, lambda g, dev: ((_r(g, (0, 37), d, dev), _r(g, (19, 37), d, dev),
                                                               _r(g, (19,), d, dev)), {})),
            _case(op, "large", d, seed, lambda g, dev: ((_r(g, (65, K), d, dev), _r(g, (129, K), d, dev, K ** -0.5),
                                                         _r(g, (129,), d, dev)), {})),
        ],
        "matmul": [
            _case(op, "empty_m", d, seed, lambda g, dev: ((_r(g, (0, 16), d, dev), _r(g, (16, 7), d, dev)), {})),
            # K = 0: the product of an empty sum is all zeros, of shape (M, N).
            _case(op, "empty_k", d, seed, lambda g, dev: ((_r(g, (5, 0), d, dev), _r(g, (0, 7), d, dev)), {})),
            _case(op, "large", d, seed,
                  lambda g, dev: ((_r(g, (67, K), d, dev), _r(g, (K, 131), d, dev, K ** -0.5)), {})),
        ],
        "rms_norm": [
            _case(op, "empty", d, seed, lambda g, dev: ((_r(g, (0, 64), d, dev), _r(g, (64,), d, dev, 0.1, 1.0)), {})),
            _case(op, "large", d, seed,
                  lambda g, dev: ((_r(g, (33, H), d, dev, 2.0), _r(g, (H,), d, dev, 0.1, 1.0)), {})),
        ],
        "layer_norm": [
            _case(op, "empty", d, seed, lambda g, dev: ((_r(g, (0, 64), d, dev), _r(g, (64,), d, dev, 0.1, 1.0),
                                                         _r(g, (64,), d, dev, 0.1)), {})),
            _case(op, "large", d, seed,
                  lambda g, dev: ((_r(g, (33, H), d, dev, 1.0, 3.0), _r(g, (H,), d, dev, 0.1, 1.0),
                                   _r(g, (H,), d, dev, 0.1)), {})),
        ],
        "softmax": [
            _case(op, "empty", d, seed, lambda g, dev: ((_r(g, (0, 37), d, dev),), {})),
            _case(op, "large", d, seed, lambda g, dev: ((_r(g, (17, H), d, dev, 3.0),), {})),
        ],
        "scaled_dot_product_attention": [
            _case(op, "empty_seq", d, seed, lambda g, dev: ((_r(g, (2, 3, 0, 16), d, dev), _r(g, (2, 3, 0, 16), d, dev),
                                                             _r(g, (2, 3, 0, 16), d, dev)), {})),
            _case(op, "large", d, seed, lambda g, dev: ((_r(g, (1, 2, 257, 64), d, dev), _r(g, (1, 2, 257, 64), d, dev),
                                                         _r(g, (1, 2, 257, 64), d, dev)), {"is_causal": True})),
        ],
        "gelu": [
            _case(op, "empty", d, seed, lambda g, dev: ((_r(g, (0, 7), d, dev),), {})),
            _case(op, "large", d, seed, lambda g, dev: ((_r(g, (33, H), d, dev, 3.0),), {"approximate": "tanh"})),
        ],
        "silu": [
            _case(op, "empty", d, seed, lambda g, dev: ((_r(g, (3, 0), d, dev),), {})),
            _case(op, "large", d, seed, lambda g, dev: ((_r(g, (33, H), d, dev, 3.0),), {})),
        ],
        "swiglu": [
            _case(op, "empty", d, seed, lambda g, dev: ((_r(g, (0, 38), d, dev),), {})),
            _case(op, "large", d, seed, lambda g, dev: ((_r(g, (17, 2 * H), d, dev, 2.0),), {})),
        ],
        "rotary_embedding": [
            _case(op, "empty", d, seed, lambda g, dev: ((_r(g, (2, 0, 3, 16), d, dev), _r(g, (1, 0, 1, 16), d, dev),
                                                         _r(g, (1, 0, 1, 16), d, dev)), {})),
            _case(op, "large", d, seed, lambda g, dev: _rotary_large(g, dev, d)),
        ],
        "cross_entropy": [
            # N = 0: the mean over no rows is 0 in the reference (torch's own gives NaN).
            _case(op, "empty", d, seed, lambda g, dev: ((_r(g, (0, 29), d, dev), torch.zeros(0, dtype=torch.long,
                                                                                               device=dev)), {})),
            _case(op, "large", d, seed, lambda g, dev: ((_r(g, (65, H), d, dev, 2.0),
                                                         torch.randint(0, H, (65,), generator=g).to(dev)), {})),
        ],
        "embedding": [
            _case(op, "empty", d, seed, lambda g, dev: ((torch.zeros(0, dtype=torch.long, device=dev),
                                                         _r(g, (50, 16), d, dev)), {})),
            _case(op, "large", d, seed, lambda g, dev: ((torch.randint(0, 4099, (257,), generator=g).to(dev),
                                                         _r(g, (4099, 65), d, dev)), {})),
        ],
        "adamw_step": [
            _case(op, "empty", d, seed, _adamw(d, [(0,), (0, 7)], 2), mutates=(0, 2, 3)),
            _case(op, "large", d, seed, _adamw(d, [(257, 129), (4099,)], 7), mutates=(0, 2, 3)),
        ],
    }
    cases = out[op] + range_cases(op, d, seed)
    return [c for c in cases if large or c.name != "large"]


# Input magnitudes far from 1 that a correct kernel handles within the tolerance table (the error of
# a normalisation or a softmax is scale-invariant) and a naive one does not: x * x overflows float16
# past 256, exp overflows float32 past 88, a one-hot gather turns one inf into a row of NaN.
_NORM_SCALE = {torch.float16: 1e3, torch.bfloat16: 1e3, torch.float32: 1e15, torch.float64: 1e150}


def range_cases(op: str, d: torch.dtype, seed: int = 0) -> list[OpCase]:
    """A `range` case per op where one exists: inputs spanning the dtype's range (see above)."""
    s = _NORM_SCALE[d]
    makers: dict[str, Callable] = {
        "rms_norm": lambda g, dev: ((_r(g, (5, 64), d, dev, s), _r(g, (64,), d, dev, 0.1, 1.0)), {}),
        "layer_norm": lambda g, dev: ((_r(g, (5, 64), d, dev, s), _r(g, (64,), d, dev, 0.1, 1.0),
                                       _r(g, (64,), d, dev, 0.1)), {}),
        "softmax": lambda g, dev: ((_r(g, (7, 37), d, dev, 100.0),), {}),
        "cross_entropy": lambda g, dev: ((_r(g, (9, 29), d, dev, 100.0),
                                          torch.randint(0, 29, (9,), generator=g).to(dev)), {}),
        "silu": lambda g, dev: ((_r(g, (5, 37), d, dev, 1e3),), {}),
        "gelu": lambda g, dev: ((_r(g, (5, 37), d, dev, 1e3),), {}),
        "swiglu": lambda g, dev: ((_r(g, (5, 38), d, dev, 100.0),), {}),
        "embedding": lambda g, dev: ((torch.randint(0, 50, (23,), generator=g).to(dev),
                                      _whole_range(g, (50, 16), d, dev)), {}),
    }
    make = makers.get(op)
    return [_case(op, "range", d, seed, make)] if make else []


def _whole_range(g, shape, d, dev):
    """Values over the dtype's whole range: +-max, +-inf, NaN, -0.0, subnormals (a gather copies them)."""
    from hal.conformance.levels.collective_golden import _float_values
    n = 1
    for k in shape:
        n *= k
    return _float_values(g, str(d).removeprefix("torch."), n, "move").reshape(shape).to(dev)


def _rotary_large(g, dev, d):
    from hal.ops.golden import rotary_tables
    S, D = 257, 128
    cos, sin = rotary_tables(S, D)
    x = _r(g, (1, S, 4, D), d, dev)
    return (x, cos.reshape(1, S, 1, D).to(dev, d), sin.reshape(1, S, 1, D).to(dev, d)), {}

