"""hal_ascend's native path against the torch_npu stand-in, run inside a throwaway worker process
(the stand-in renames torch's PrivateUse1 backend to `npu`, irreversibly, as torch_npu does).

Each case returns picklable observations; tests/test_plugin_ascend.py asserts on them.
"""
from __future__ import annotations

import math
import os
import warnings
from datetime import timedelta

import torch

from . import activate


def _bind(device_name: str = "Ascend910B2", device_count: int = 4, env: dict | None = None):
    activate()
    import torch_npu  # noqa: F401  (the stand-in: registers torch.npu)
    from torch_npu._state import STATE

    import hal
    import hal_ascend
    import hal_cpu
    for key in ("LOCAL_RANK", "ASCEND_RT_VISIBLE_DEVICES", "HCCL_EXEC_TIMEOUT", "HCCL_CONNECT_TIMEOUT",
                "TORCH_HCCL_BLOCKING_WAIT", "HCCL_BLOCKING_WAIT", "TORCH_HCCL_ASYNC_ERROR_HANDLING",
                "HCCL_ASYNC_ERROR_HANDLING"):
        os.environ.pop(key, None)
    os.environ.update(env or {})
    STATE.reset()
    STATE.device_count, STATE.device_name = device_count, device_name
    hal_ascend.hccl._applied.clear()  # torch_npu reads HCCL timeouts once per process: start afresh
    hal.reset()
    pm = hal.PluginManager()
    pm.register(hal_cpu)
    pm.register(hal_ascend)
    return hal.bind("ascend", emulated=False, pm=pm), STATE


def native_bind(local_rank: int, visible: str, device_name: str) -> dict:
    import hal_ascend
    acc, state = _bind(device_name, 4, {"LOCAL_RANK": str(local_rank), "ASCEND_RT_VISIBLE_DEVICES": visible})
    return {"device": str(acc.device), "emulated": acc.emulated, "profile": acc.profile.model,
            "calls": [c[:2] for c in state.record.calls if c[0] in ("set_device", "get_device_name")],
            "contexts": list(state.contexts), "first_context": state.record.named("context_opened")[:1],
            "capabilities_source": acc.capabilities.source,
            "memory": acc.get_memory_info(), "runtime": type(acc.runtime).__name__,
            "stream": acc.Stream.__module__, "probe": hal_ascend.probe(),
            "kernels": {op: (k.plugin, k.name) for op, k in acc.kernels.items()}}


def process_groups(timeouts_s: list, preset: dict, device_name: str = "Ascend910B2",
                   global_ranks: list | None = (0, 1), group_name: str | None = "g0") -> dict:
    import torch.distributed as dist
    acc, state = _bind(device_name, env=preset)
    caught = []
    for i, t in enumerate(timeouts_s):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            kw = {} if group_name is None else {"group_name": f"{group_name}.{i}"}
            pg = acc.new_process_group(dist.HashStore(), 1, 2, timedelta(seconds=t),
                                       global_ranks=global_ranks, **kw)
        caught.append([str(x.message) for x in w])
        assert pg.getBackendName() == "hccl"
    return {"groups": [c[1:] for c in state.record.named("ProcessGroupHCCL")], "warnings": caught,
            "env": {k: os.environ.get(k) for k in ("HCCL_EXEC_TIMEOUT", "HCCL_CONNECT_TIMEOUT")},
            "exec_timeout_first_read": state.exec_timeout_first_read}


def options_reject(field: str):
    """Assign `field` on a ProcessGroupHCCL.Options: None if accepted, else the error text."""
    activate()
    import torch_npu
    opts = torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options()
    try:
        setattr(opts, field, "x")
    except AttributeError as exc:
        return f"AttributeError: {exc}"
    return None


def capabilities(device_name: str) -> dict:
    """The bound chip's matrix for a product, as (collective, dtype, op) -> declared."""
    acc, _ = _bind(device_name)
    probe = [("broadcast", "float8_e4m3fn", "-"), ("all_gather", "bfloat16", "-"),
             ("all_reduce", "bfloat16", "sum"), ("all_reduce", "bfloat16", "product"),
             ("all_reduce", "int16", "product"), ("all_reduce", "int16", "sum"), ("all_reduce", "int64", "sum"),
             ("all_reduce", "float32", "product"), ("reduce_scatter_tensor", "bfloat16", "max")]
    return {"source": acc.capabilities.source,
            "declared": {f"{c}/{d}/{o}": acc.capabilities.supports(c, d, None if o == "-" else o)
                         for c, d, o in probe}}


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got.float() - want.float()).abs().max().item() if got.numel() else 0.0


def op_overrides() -> dict:
    import hal
    from hal.ops import reference as ref
    acc, state = _bind("Ascend910B3")
    rec = state.record
    out: dict = {"kernels": {op: k.name for op, k in acc.kernels.items()}}
    g = torch.Generator().manual_seed(0)

    def run(label, fn, *args, want):
        rec.clear()
        got = fn(*args)
        out[label] = {"err": _err(got, want), "calls": list(rec.calls), "nan": bool(torch.isnan(got).any())}
        return got

    x, w = torch.randn(4, 6, 32, generator=g), torch.randn(32, generator=g)
    run("rms_norm", hal.ops.rms_norm, x, w, 1e-5, want=ref.rms_norm(x, w, 1e-5))
    xb = x.bfloat16()
    run("rms_norm_bf16_f32w", hal.ops.rms_norm, xb, w, 1e-5, want=ref.rms_norm(xb, w, 1e-5))
    xd = x.double()
    run("rms_norm_f64", hal.ops.rms_norm, xd, w.double(), 1e-5, want=ref.rms_norm(xd, w.double(), 1e-5))

    q = torch.randn(2, 4, 6, 16, generator=g)
    k = torch.randn(2, 4, 9, 16, generator=g)
    v = torch.randn(2, 4, 9, 16, generator=g)
    run("sdpa_plain", hal.ops.scaled_dot_product_attention, q, k, v, want=ref.scaled_dot_product_attention(q, k, v))
    run("sdpa_causal", hal.ops.scaled_dot_product_attention, q, k, v, None, True,
        want=ref.scaled_dot_product_attention(q, k, v, None, True))
    mask = torch.rand(2, 1, 6, 9, generator=g) > 0.4
    mask[1, 0, 3] = False  # no key for this query: the HAL returns zeros there
    live = torch.rand(2, 1, 6, 9, generator=g) > 0.4
    live[..., 0] = True  # every query has a key
    run("sdpa_live_mask", hal.ops.scaled_dot_product_attention, q, k, v, live, False, 0.2,
        want=ref.scaled_dot_product_attention(q, k, v, live, False, 0.2))
    got = run("sdpa_bool_mask", hal.ops.scaled_dot_product_attention, q, k, v, mask, False, 0.2,
              want=ref.scaled_dot_product_attention(q, k, v, mask, False, 0.2))
    out["sdpa_bool_mask"]["dead_row_zero"] = bool((got[1, :, 3] == 0).all())
    # FA's mask means "True = masked": the adapter must hand it the complement, in B1SS layout.
    out["sdpa_bool_mask"]["fa_mask_is_complement"] = bool(torch.equal(state.last_atten_mask, ~mask))
    heads_mask = torch.rand(1, 4, 6, 9, generator=g) > 0.3
    run("sdpa_head_mask_causal", hal.ops.scaled_dot_product_attention, q, k, v, heads_mask, True,
        want=ref.scaled_dot_product_attention(q, k, v, heads_mask, True))
    add = torch.randn(6, 9, generator=g)
    run("sdpa_float_mask", hal.ops.scaled_dot_product_attention, q, k, v, add,
        want=ref.scaled_dot_product_attention(q, k, v, add))

    xr = torch.randn(2, 4, 6, 16, generator=g)
    ang = torch.randn(1, 1, 6, 8, generator=g)
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    run("rotary", hal.ops.rotary_embedding, xr, cos, sin, want=ref.rotary_embedding(xr, cos, sin))
    run("rotary_2d_cos", hal.ops.rotary_embedding, xr, cos[0, 0], sin[0, 0],
        want=ref.rotary_embedding(xr, cos[0, 0], sin[0, 0]))

    xs = torch.randn(3, 32, 8, generator=g).transpose(1, 2)  # non-contiguous
    run("swiglu", hal.ops.swiglu, xs, -1, want=ref.swiglu(xs, -1))
    out["scale_default"] = 1.0 / math.sqrt(16)
    return out


def golden_failures(dtypes: list) -> dict:
    """Every op the ascend plugin overrides, through hal.ops, on the HAL's golden cases."""
    import hal
    from hal.ops import golden
    acc, state = _bind("Ascend910B2")
    ops = sorted(op for op, k in acc.kernels.items() if k.plugin == "ascend")
    failures = [r.describe() for op in ops for d in dtypes
                for r in golden.check_op(getattr(hal.ops, op), op, getattr(torch, d), acc.kernels[op].name)
                if not r.ok]
    vendor_calls = sorted({c[0] for c in state.record.calls if c[0].startswith("npu_")})
    return {"ops": ops, "failures": failures, "vendor_calls": vendor_calls}


def family_kernels(device_name: str) -> dict:
    acc, _ = _bind(device_name)
    return {op: k.name for op, k in acc.kernels.items() if k.plugin == "ascend"}


def hccl_timeout(preset: dict | None = None, timeout_s: float = 0.5) -> dict:
    """Ranks 0 and 1 of one HCCL group built by the plugin; rank 0 all-reduces through the bridge's
    `Ccl` (which waits with `work.wait(timeout)`), rank 1 never joins. What the survivor saw, and
    whether the watchdog would have torn the process down by the time the group timeout passed."""
    import time

    import torch.distributed as dist

    from hal.ccl_bridge.ccl import Ccl, StageFailure
    acc, state = _bind(env=preset)
    t = timedelta(seconds=timeout_s)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = dist.HashStore()
        pgs = [acc.new_process_group(store, r, 2, t, global_ranks=[0, 1], group_name="g") for r in (0, 1)]
    ccl = Ccl(pgs[0], acc.capabilities, "ascend sub-cluster CCL (ranks [0, 1])", 0, 2, torch.device("npu", 0), t)
    t0 = time.monotonic()
    raised = None
    try:
        ccl.all_reduce(torch.ones(8), "sum").wait()
    except StageFailure as exc:
        raised = {"type": type(exc.cause).__name__, "message": str(exc)}
    waited = time.monotonic() - t0
    time.sleep(timeout_s + 0.5)  # past the group's watchdog timeout
    return {"raised": raised, "waited_s": waited, "teardowns": list(state.teardowns),
            "blocking_wait": [pg.blocking_wait for pg in pgs],
            "async_error_handling": [pg.async_error_handling for pg in pgs],
            "env": {k: os.environ.get(k) for k in ("TORCH_HCCL_BLOCKING_WAIT", "HCCL_BLOCKING_WAIT",
                                                   "TORCH_HCCL_ASYNC_ERROR_HANDLING")},
            "warnings": [str(w.message) for w in caught]}
