"""AdamW whose update is `hal.ops.adamw_step`, so the optimizer step runs on the chip's own kernel
(a fused vendor kernel where the plugin provides one, the reference kernel otherwise)."""
from __future__ import annotations

from typing import Iterable

import torch

import hal.ops as ops


class HalAdamW(torch.optim.Optimizer):
    """torch.optim.AdamW's update rule (decoupled weight decay, bias correction), one call per step."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01) -> None:
        if lr <= 0 or eps <= 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"HalAdamW: need lr > 0, eps > 0, weight_decay >= 0, 0 <= betas < 1; got "
                             f"lr={lr}, eps={eps}, weight_decay={weight_decay}, betas={betas}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            by_step: dict[int, tuple[list, list, list, list]] = {}  # adamw_step takes one step count
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                lists = by_step.setdefault(state["step"], ([], [], [], []))
                for lst, t in zip(lists, (p, p.grad, state["exp_avg"], state["exp_avg_sq"])):
                    lst.append(t)
            b1, b2 = group["betas"]
            for step, (params, grads, avgs, sqs) in by_step.items():
                ops.adamw_step(params, grads, avgs, sqs, step, group["lr"], b1, b2, group["eps"],
                               group["weight_decay"])
        return loss
