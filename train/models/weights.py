"""Parameters of any family: their count, and deterministic initialisation of possibly sharded
ones (each full tensor is drawn once from one generator, the same on every rank, then this
rank's shard of it is kept, so the values do not depend on the mesh)."""

from __future__ import annotations

import torch


def full_device(param: torch.Tensor) -> torch.device:
    """The device a parameter's (local) storage is on."""
    from torch.distributed.tensor import DTensor

    if isinstance(param, DTensor):
        return param.to_local().device
    return param.device


def copy_full(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy a full tensor into ``param``, which may be a sharded DTensor."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(param, DTensor):
        # src_data_rank=None: every rank holds the same full tensor; no broadcast needed.
        shard = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
        param.to_local().copy_(shard.to_local())
    else:
        param.copy_(full)


def filler(device: torch.device, seed: int):
    """``fill(param, std, trunc=True)``: draw a full N(0, std) tensor (truncated at 3 std) from one
    generator seeded with ``seed`` and copy this rank's part of it into ``param``."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def fill(param: torch.Tensor, std: float, trunc: bool = True) -> None:
        full = torch.empty(param.shape, dtype=torch.float32, device=device)
        if trunc:
            torch.nn.init.trunc_normal_(full, mean=0.0, std=std, a=-3 * std, b=3 * std, generator=gen)
        else:
            torch.nn.init.normal_(full, mean=0.0, std=std, generator=gen)
        copy_full(param, full)

    return fill


def count_params(model: torch.nn.Module) -> int:
    """Parameters of a (possibly sharded) model: each tensor's global size, a tied one once."""
    return sum(p.numel() for p in model.parameters())
