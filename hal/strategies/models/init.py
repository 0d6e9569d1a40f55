"""Meta-device construction and the per-parameter initialiser: build a model whose parameters are on the
meta device (no storage), let `apply_plan` keep this rank's stages / TP shards / experts, then
materialise only what is left here.

    with meta_parameters():                 # parameters on meta, buffers (rotary tables) real
        model = GPT(cfg)
    run = apply_plan(model, plan, materialize=lambda m: materialize(m, seed))

The value of every parameter is a deterministic function of (seed, the full model's parameter name, its
full shape): `init_value`. A rank that holds a TP shard or an FSDP2 shard of a parameter computes the
full tensor of that one parameter and keeps its own piece (torch's `distribute_tensor` with
`src_data_rank=None`: local slicing, no communication), so every rank holds exactly the values the
single-process model (`build_model(cfg, seed)`, materialised by the same function) holds. The full
tensor of one parameter exists transiently during materialisation; no rank ever holds the whole model.

Initialisation (GPT-2 / Llama style): RMSNorm gains 1, biases 0, every other weight N(0, 0.02). The one
definition: `GPT(cfg, seed)` built on a real device fills its parameters with it too (`real_parameters`).
"""
from __future__ import annotations

import hashlib
from contextlib import contextmanager
from typing import Iterator, Optional

import torch
from torch import nn

INIT_STD = 0.02


def _param_seed(seed: int, name: str, shape: tuple[int, ...]) -> int:
    """A 63-bit generator seed from (seed, name, full shape): the same on every rank and process."""
    digest = hashlib.sha256(f"{int(seed)}|{name}|{tuple(shape)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def init_value(name: str, shape: tuple[int, ...], seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The full initial value of parameter `name` (the full model's name, e.g. 'blocks.3.attn.wq.weight')
    of full `shape` under `seed`: ones for norm gains, zeros for biases, N(0, INIT_STD) otherwise."""
    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=dtype)
    if name.endswith(".bias") or name == "bias":
        return torch.zeros(shape, dtype=dtype)
    g = torch.Generator().manual_seed(_param_seed(seed, name, shape))
    return (torch.randn(shape, generator=g, dtype=torch.float32) * INIT_STD).to(dtype)


@contextmanager
def meta_parameters() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device (shape and dtype, no storage);
    buffers stay where they were made (the rotary tables are derived from the config, cheap, and
    needed as they are). What accelerate's init_empty_weights(include_buffers=False) does."""
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: Optional[nn.Parameter]) -> None:
        original(module, name, param)
        if param is not None and not param.is_meta:
            kwargs = {"requires_grad": param.requires_grad}
            module._parameters[name] = type(param)(param.to("meta"), **kwargs)

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def real_parameters(module: nn.Module) -> set[str]:
    """Names of the parameters of `module` that have storage (not meta, not fake): what GPT(cfg, seed)
    initialises when it is built on a real device."""
    from torch._subclasses.fake_tensor import is_fake
    return {n for n, p in module.named_parameters() if not p.is_meta and not is_fake(p)}


def meta_names(module: nn.Module) -> list[str]:
    """Names of the parameters of `module` still on the meta device."""
    from torch.distributed.tensor import DTensor
    return [n for n, p in module.named_parameters()
            if (p._local_tensor if isinstance(p, DTensor) else p).is_meta]


def materialize(module: nn.Module, seed: int, device: Optional[torch.device] = None,
                prefix: str = "") -> list[str]:
    """Allocate every meta parameter of `module` on `device` (default cpu) and fill it with its piece of
    `init_value(prefix + name, full shape, seed)`: a plain tensor takes the full value, a DTensor (TP,
    FSDP2) the local piece of its placements. Parameters already materialised are left alone. Works
    before or after DDP / FSDP2 wrapping (FSDP2 re-reads the new local shards at its lazy init, see
    torch's FSDPParam.reset_sharded_param). Returns the names it filled."""
    names = set(meta_names(module))
    if not names:
        return []
    dev = torch.device(device or "cpu")

    def alloc(t: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor
        local = t._local_tensor if isinstance(t, DTensor) else t
        return torch.empty_like(t, device=dev) if local.is_meta else t

    module._apply(alloc)  # nn.Module.to_empty, but only for the meta tensors (buffers stay as they are)
    fill(module, seed, prefix, names)
    return sorted(names)


@torch.no_grad()
def fill(module: nn.Module, seed: int, prefix: str = "", names: Optional[set[str]] = None) -> None:
    """Write `init_value` into the (allocated) parameters of `module` named in `names` (default all)."""
    from torch.distributed.tensor import DTensor, distribute_tensor
    for name, p in module.named_parameters():
        if names is not None and name not in names:
            continue
        full = init_value(prefix + _model_name(name), tuple(p.shape), seed, p.dtype)
        if isinstance(p, DTensor):
            piece = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None)._local_tensor
            p._local_tensor.copy_(piece)
        else:
            p.copy_(full)


def _model_name(name: str) -> str:
    """The full model's parameter name of a name seen through a wrapper (DDP's 'module.' prefix)."""
    return name[len("module."):] if name.startswith("module.") else name
