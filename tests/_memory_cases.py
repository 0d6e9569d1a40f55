"""What tests/test_planner_memory.py runs on every rank of its WorkerPool: apply a Plan, train two
AdamW steps, and measure the peak bytes of live tensor storage on this rank.

The CPU allocator keeps no statistics (hal's CpuRuntime reports the process RSS, which counts the
interpreter, torch's own code and freed-but-cached pages), so memory is counted the way torch's
MemTracker (torch.distributed._tools.mem_tracker) does: a TorchDispatchMode sees every tensor an op
creates on this thread, each distinct untyped storage is counted once with its nbytes, and a weakref
on the storage subtracts it when it is freed. The mode is entered before the model is built, so
parameters, DDP's gradient buckets (allocated by its C++ reducer through the dispatcher), gradients,
optimizer states, activations, pipeline receive buffers and temporaries are all counted. Not seen:
tensors made on other threads (the bridge's and gloo's internal staging buffers); the cost model's
fixed BRIDGE_STAGING term is left out of the comparison for that reason.
"""
from __future__ import annotations

import gc
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

_book = None


class LiveStorageBytes(TorchDispatchMode):
    """Live and peak bytes of the distinct tensor storages created by ops while active."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._refs: dict[int, tuple] = {}

    def _free(self, key: int, nbytes: int, _ref) -> None:
        if self._refs.pop(key, None) is not None:
            self.live -= nbytes

    def track(self, t: torch.Tensor) -> None:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return
        local = getattr(t, "_local_tensor", None)   # DTensor: count its local shard
        if local is not None:
            t = local
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        key = st._cdata
        if key in self._refs:
            return
        nb = st.nbytes()
        self._refs[key] = (weakref.ref(st, lambda r, k=key, n=nb: self._free(k, n, r)), nb)
        self.live += nb
        self.peak = max(self.peak, self.live)

    def reset_peak(self) -> None:
        self.peak = self.live

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            self.track(t)
        return out


def init(timeout_s: float = 120.0) -> dict:
    import hal.ccl_bridge  # noqa: F401 - registers the `hetero` backend
    import hal
    global _book
    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("hetero", timeout=timedelta(seconds=timeout_s))
        _book = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    acc = hal.accelerator()
    return {"rank": dist.get_rank(), "chip": acc.chip.name, "emulated": bool(acc.emulated)}


def peak_memory(plan_json: str, model: dict) -> dict:
    """Build, apply and train two AdamW steps under LiveStorageBytes; the peak over both steps
    (after the full model's unused blocks are freed), and the live bytes before the first step."""
    from hal.strategies.apply import apply_plan
    from hal.strategies.models import ModelConfig, build_model
    from hal.strategies.plan import Plan
    plan = Plan.from_json(plan_json)
    cfg = ModelConfig(**model)
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, cfg.vocab, (plan.global_batch, cfg.seq + 1), generator=g)
    x, y = data[:, :-1], data[:, 1:]
    gc.collect()
    mode = LiveStorageBytes()
    with mode:
        net = build_model(cfg, 0)
        run = apply_plan(net, plan, timeout=timedelta(seconds=120))
        del net                      # the stage modules hold their blocks; the rest is freed
        gc.collect()
        params = run.parameters()
        opt = torch.optim.AdamW(params, lr=1e-4, foreach=False) if params else None
        before = mode.live
        mode.reset_peak()
        peaks = []
        for _ in range(2):
            run.step(x, y)
            if opt is not None:
                opt.step()
                opt.zero_grad(set_to_none=True)
            peaks.append(mode.peak)
        after = mode.live
    n_params = sum(p.numel() for p in params)
    del run, opt, params
    gc.collect()
    dist.barrier(group=_book)
    return {"rank": dist.get_rank(), "before": before, "peak": max(peaks), "peaks": peaks, "after": after,
            "params": n_params}
