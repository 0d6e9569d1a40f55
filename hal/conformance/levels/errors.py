"""Level `errors`: bad input gives a Python exception that says what was wrong, never an abort or a hang.

Every check runs in the worker pool, so an abort (a vendor library calling abort(), a segfault)
kills a worker, not the suite, and is reported as such; a hang is cut by the check's timeout. For
collectives every rank passes the same bad input, so a refusal is symmetric; after the refusals
the group must still work (one small all_reduce), since a refused call must not poison it.
"""
from __future__ import annotations

from typing import Any, Callable

from ..bounds import multi_rank_timeout
from ..checks import Check, CheckFailed, CheckNotApplicable


def _expect_raise(what: str, call: Callable[[], Any]) -> str:
    try:
        out = call()
        if hasattr(out, "wait"):
            out.wait()
    except Exception as exc:
        return f"{what}: {type(exc).__name__}"
    desc = f"a {type(out).__name__}" if out is not None else "None"
    if hasattr(out, "dtype"):
        desc = f"a tensor of {out.dtype}{tuple(out.shape)}"
    raise CheckFailed(f"{what}: expected an exception naming the problem, got {desc}")


def _kernel(ctx, op: str) -> Callable:
    return ctx.acc.kernels[op].fn


def check_op_wrong_dtype(ctx) -> str:
    import torch
    dev = ctx.device
    got = [
        _expect_raise("matmul(float32, int64)", lambda: _kernel(ctx, "matmul")(
            torch.ones(4, 4, device=dev), torch.ones(4, 4, dtype=torch.int64, device=dev))),
        _expect_raise("embedding(float32 ids)", lambda: _kernel(ctx, "embedding")(
            torch.ones(3, device=dev), torch.ones(5, 4, device=dev))),
        _expect_raise("cross_entropy(float32 targets)", lambda: _kernel(ctx, "cross_entropy")(
            torch.ones(3, 5, device=dev), torch.ones(3, device=dev))),
    ]
    return "raised: " + "; ".join(got)


def check_op_wrong_device(ctx) -> str:
    import torch
    dev = ctx.device
    if dev.type == "cpu":
        raise CheckNotApplicable("the chip's tensors are host tensors: there is no second device to mix in")
    got = [
        _expect_raise(f"matmul({dev.type}, cpu)", lambda: _kernel(ctx, "matmul")(
            torch.ones(4, 4, device=dev), torch.ones(4, 4))),
        _expect_raise(f"linear({dev.type} x, cpu weight)", lambda: _kernel(ctx, "linear")(
            torch.ones(2, 4, device=dev), torch.ones(3, 4))),
    ]
    return "raised: " + "; ".join(got)


def check_op_mismatched_shapes(ctx) -> str:
    import torch
    dev = ctx.device
    got = [
        _expect_raise("matmul((3,4), (5,6))", lambda: _kernel(ctx, "matmul")(
            torch.ones(3, 4, device=dev), torch.ones(5, 6, device=dev))),
        _expect_raise("linear(x (2,8), weight (4,7))", lambda: _kernel(ctx, "linear")(
            torch.ones(2, 8, device=dev), torch.ones(4, 7, device=dev))),
        _expect_raise("rms_norm(x (3,8), weight (5,))", lambda: _kernel(ctx, "rms_norm")(
            torch.ones(3, 8, device=dev), torch.ones(5, device=dev))),
        _expect_raise("layer_norm(x (3,8), weight (5,), bias (5,))", lambda: _kernel(ctx, "layer_norm")(
            torch.ones(3, 8, device=dev), torch.ones(5, device=dev), torch.zeros(5, device=dev))),
        _expect_raise("rotary_embedding(x (2,4,8), cos/sin (4,6))", lambda: _kernel(ctx, "rotary_embedding")(
            torch.ones(2, 4, 8, device=dev), torch.ones(4, 6, device=dev), torch.ones(4, 6, device=dev))),
    ]
    return "raised: " + "; ".join(got)


def check_device_index(ctx) -> str:
    acc = ctx.acc
    if acc.runtime.device_type == "cpu":
        raise CheckNotApplicable("host runtime: every local rank shares the host, any index names it")
    count = acc.device_count()
    start = acc.current_device_index()
    try:
        return "raised: " + _expect_raise(f"set_device_index({count}) with {count} devices",
                                          lambda: acc.set_device_index(count))
    finally:
        acc.set_device_index(start)


def _still_works(ctx) -> str:
    import torch
    import torch.distributed as dist
    t = torch.ones(4, device=ctx.device)
    ctx.ccl().allreduce([t], dist.AllreduceOptions()).wait()
    if t.cpu().tolist() != [float(ctx.world_size)] * 4:
        raise CheckFailed(f"after the refused calls, all_reduce(ones) gave {t.cpu().tolist()}, expected "
                          f"{[float(ctx.world_size)] * 4}: a refused call left the group broken")
    return "the group still works afterwards"


def check_collective_wrong_dtype(ctx) -> str:
    import torch
    pg, dev, w = ctx.ccl(), ctx.device, ctx.world_size
    got = [
        _expect_raise("all_gather_into_tensor(out float64, in float32)", lambda: pg._allgather_base(
            torch.empty(4 * w, dtype=torch.float64, device=dev), torch.ones(4, device=dev))),
        _expect_raise("all_gather(out int64 list, in float32)", lambda: pg.allgather(
            [[torch.empty(4, dtype=torch.int64, device=dev) for _ in range(w)]], [torch.ones(4, device=dev)])),
    ]
    return "raised: " + "; ".join(got) + "; " + _still_works(ctx)


def check_collective_mismatched_sizes(ctx) -> str:
    import torch
    import torch.distributed as dist
    pg, dev, w = ctx.ccl(), ctx.device, ctx.world_size
    got = [
        _expect_raise(f"all_gather_into_tensor(out {4 * w + 1} elements, in 4)", lambda: pg._allgather_base(
            torch.empty(4 * w + 1, device=dev), torch.ones(4, device=dev))),
        _expect_raise(f"reduce_scatter_tensor(out 4, in {4 * w + 1})", lambda: pg._reduce_scatter_base(
            torch.empty(4, device=dev), torch.ones(4 * w + 1, device=dev), dist.ReduceScatterOptions())),
        _expect_raise("all_to_all_single(splits that do not sum to the size)", lambda: pg.alltoall_base(
            torch.empty(2 * w, device=dev), torch.ones(2 * w, device=dev), [1] * w, [3] * w,
            dist.AllToAllOptions())),
    ]
    return "raised: " + "; ".join(got) + "; " + _still_works(ctx)


def check_collective_root(ctx) -> str:
    import torch
    import torch.distributed as dist
    pg, dev, w = ctx.ccl(), ctx.device, ctx.world_size

    def bcast(root):
        o = dist.BroadcastOptions()
        o.rootRank = root
        return pg.broadcast([torch.ones(4, device=dev)], o)

    def reduce(root):
        o = dist.ReduceOptions()
        o.rootRank = root
        return pg.reduce([torch.ones(4, device=dev)], o)

    got = [_expect_raise(f"broadcast(root={w}) with {w} ranks", lambda: bcast(w)),
           _expect_raise("broadcast(root=-1)", lambda: bcast(-1)),
           _expect_raise(f"reduce(root={w}) with {w} ranks", lambda: reduce(w))]
    return "raised: " + "; ".join(got) + "; " + _still_works(ctx)


def check_collective_wrong_device(ctx) -> str:
    import torch
    pg, dev = ctx.ccl(), ctx.device
    other = "meta" if dev.type == "cpu" else "cpu"
    got = [_expect_raise(f"all_reduce of a {other} tensor on the {dev.type} group",
                         lambda: pg.allreduce([torch.ones(4, device=other)]))]
    return "raised: " + "; ".join(got) + "; " + _still_works(ctx)


TIMEOUT_S = 2.0


def check_collective_timeout(ctx) -> str:
    """Rank 0 enters an all_reduce nobody else joins: it must raise after the group's timeout."""
    import time

    import torch
    pg = ctx.new_group(timeout_s=TIMEOUT_S)
    if ctx.rank != 0:
        ctx.agree_max([0.0])  # wait here (on the trusted control group) until rank 0 is done
        return "did not join (the missing peer)"
    t0 = time.perf_counter()
    try:
        msg = _expect_raise(f"all_reduce with no peer, group timeout {TIMEOUT_S:g}s",
                            lambda: pg.allreduce([torch.ones(4, device=ctx.device)]))
    finally:
        ctx.agree_max([0.0])
    return f"{msg} after {time.perf_counter() - t0:.1f}s"


# (name, what it checks, function): ops on rank 0 (60 s each), then the chip's group on every rank.
_OP_CHECKS = [
    ("op_wrong_dtype", "ops given operands of the wrong dtype raise", check_op_wrong_dtype),
    ("op_wrong_device", "ops given a tensor on another device raise", check_op_wrong_device),
    ("op_mismatched_shapes", "ops given operands of mismatched shapes raise", check_op_mismatched_shapes),
    ("device_index_out_of_range", "set_device_index(device_count()) raises", check_device_index),
]
_GROUP_CHECKS = [
    ("collective_wrong_dtype", "collectives whose output dtype differs from the input raise; the group still works",
     check_collective_wrong_dtype),
    ("collective_mismatched_sizes",
     "collectives with mismatched output/input sizes or splits raise; the group still works",
     check_collective_mismatched_sizes),
    ("collective_root_out_of_range", "broadcast/reduce with root >= world or < 0 raise; the group still works",
     check_collective_root),
    ("collective_wrong_device", "a tensor on another device given to the chip's group raises; the group still works",
     check_collective_wrong_device),
]


def discover(target) -> list[Check]:
    t = multi_rank_timeout(target.group_timeout_s)
    return ([Check(f"errors.{name}", "errors", doc, fn, where="rank0", timeout=60) for name, doc, fn in _OP_CHECKS]
            + [Check(f"errors.{name}", "errors", doc, fn, where="all", timeout=t) for name, doc, fn in _GROUP_CHECKS]
            + [Check("errors.collective_timeout", "errors",
                     "a collective whose peers never join raises after the group's timeout instead of hanging",
                     check_collective_timeout, where="all", timeout=TIMEOUT_S + 60)])
