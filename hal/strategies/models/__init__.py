"""Models for the strategies and the trainer: `ModelConfig` (sizes and the per-layer FLOP/byte counts
the planner uses), `GPT` (Llama-style decoder through hal.ops, dense or MoE; the one decoder every
strategy, the trainer and `hal demo` use), and the shared losses and synthetic data.

    from hal.strategies.models import ModelConfig, GPT, build_model
    model = build_model(ModelConfig.from_toml("examples/models/tiny.toml"), seed=0)
"""
from __future__ import annotations

import torch

from .config import ModelConfig
from .data import IGNORE_INDEX, count_tokens, lm_loss, lm_loss_sum, make_batches, rank_slice
from .gpt import GPT, HalLinear

__all__ = ["ModelConfig", "GPT", "HalLinear", "build_model", "lm_loss", "lm_loss_sum",
           "count_tokens", "make_batches", "rank_slice", "IGNORE_INDEX"]


def build_model(cfg: ModelConfig, seed: int = 0, device: str = "cpu") -> GPT:
    """The GPT for `cfg`. device "meta": parameters on the meta device (no storage; apply_plan's
    `materialize` hook fills each rank's share); else materialised there, every parameter by
    hal.strategies.models.init.init_value(seed, its name, its shape), the values a rank of any plan holds."""
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"build_model: expected a ModelConfig, got {type(cfg).__name__}")
    from .init import materialize, meta_parameters
    with meta_parameters():
        model = GPT(cfg)
    if str(device) != "meta":
        materialize(model, seed, torch.device(device))
    return model
