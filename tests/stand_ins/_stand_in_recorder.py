"""The call record shared by every stand-in (a top-level module once this folder is on sys.path):
picklable summaries, so a worker process can return them."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


def summarize(value: Any) -> Any:
    """Tensors as ('tensor', shape, dtype); containers element-wise; everything else as is or repr."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), str(value.dtype).removeprefix("torch."))
    if isinstance(value, (list, tuple)):
        return type(value)(summarize(v) for v in value)
    if isinstance(value, dict):
        return {k: summarize(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


@dataclass
class Recorder:
    calls: list = field(default_factory=list)

    def record(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((name, summarize(args), summarize(kwargs)))

    def named(self, name: str) -> list:
        return [c for c in self.calls if c[0] == name]

    def clear(self) -> None:
        self.calls.clear()
