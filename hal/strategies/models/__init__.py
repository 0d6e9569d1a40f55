"""Models for the strategies and the trainer: `ModelConfig` (sizes and the per-layer FLOP/byte counts
the planner uses), `GPT` (Llama-style decoder through hal.ops, dense or MoE), the tiny transformer
of `hal demo`, and the shared losses and synthetic data.

    from hal.strategies.models import ModelConfig, GPT, build_model
    model = build_model(ModelConfig.from_toml("examples/models/tiny.toml"), seed=0)
"""
from __future__ import annotations

from typing import Union

from torch import nn

from .config import ModelConfig
from .data import IGNORE_INDEX, count_tokens, lm_loss, lm_loss_sum, make_batches, rank_slice
from .gpt import GPT, HalLinear, build_gpt
from .tiny import StageModule, TinyConfig, TinyTransformer, build_tiny, split_stages

__all__ = ["ModelConfig", "GPT", "HalLinear", "build_model", "build_gpt", "TinyConfig", "TinyTransformer",
           "StageModule", "split_stages", "build_tiny", "lm_loss", "lm_loss_sum", "count_tokens",
           "make_batches", "rank_slice", "IGNORE_INDEX"]


def build_model(cfg: Union[ModelConfig, TinyConfig], seed: int = 0) -> nn.Module:
    """The model for `cfg` (GPT for a ModelConfig, the tiny transformer for a TinyConfig), weights
    drawn deterministically from `seed`."""
    if isinstance(cfg, ModelConfig):
        return build_gpt(cfg, seed)
    if isinstance(cfg, TinyConfig):
        return build_tiny(cfg, seed)
    raise TypeError(f"build_model: expected a ModelConfig or TinyConfig, got {type(cfg).__name__}")
