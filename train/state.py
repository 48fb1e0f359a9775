"""The trainer's checkpointed state as ``Stateful`` objects (``torch.distributed.checkpoint``).

:class:`ModelOptimizer` is the sharded part (DCP's ``.distcp`` files), read and written
through ``get_state_dict``/``set_state_dict`` so that any mesh can load any other's
checkpoint. The others are per-rank state, saved together in ``extra_rank{r}.pt``: each
returns its own keys of that file (``step``, ``world_size``, ``nan_skips``, ``scheduler``,
``scaler``, ``data``, ``rng``, ``parallel``), and loads them back from the whole dict, so
the on-disk format is the one written before these objects existed.

Everything per-rank is tensors and plain Python containers (the numpy RNG state is stored
as a tensor): the file loads with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful


def rng_state() -> dict[str, Any]:
    """All RNG states as tensors and plain Python values (loadable with weights_only)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    npst = state["numpy"]
    np.random.set_state((npst["name"], npst["keys"].numpy().astype(np.uint32), npst["pos"],
                         npst["has_gauss"], npst["cached_gaussian"]))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class ModelOptimizer(Stateful):
    """Model parameters and optimizer state, sharded as the model is (DCP)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state_dict["model"],
                       optim_state_dict=state_dict["optim"], options=StateDictOptions(strict=True))


@dataclass
class Progress(Stateful):
    """How far training got: the last finished step and the updates skipped as non-finite."""

    world_size: int
    step: int = 0
    nan_skips: int = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "world_size": self.world_size, "nan_skips": self.nan_skips}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.step = int(state_dict["step"])
        self.nan_skips = int(state_dict.get("nan_skips", 0))


class Schedule(Stateful):
    """The learning-rate scheduler and (fp16) the gradient scaler."""

    def __init__(self, scheduler, scaler=None) -> None:
        self.scheduler = scheduler
        self.scaler = scaler

    def state_dict(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler is not None else None}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict["scheduler"])
        if self.scaler is not None and state_dict.get("scaler"):
            self.scaler.load_state_dict(state_dict["scaler"])


class DataPosition(Stateful):
    """Where this rank's data loader is in its shard."""

    def __init__(self, loader) -> None:
        self.loader = loader

    def state_dict(self) -> dict[str, Any]:
        return {"data": self.loader.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.loader.load_state_dict(state_dict["data"])


class ComponentState(Stateful):
    """State registered by parallel/communication components (``Parallelized.extra_state``:
    compression residuals, LocalSGD counters), by name."""

    def __init__(self, components: dict[str, Any]) -> None:
        self.components = components

    def state_dict(self) -> dict[str, Any]:
        return {"parallel": {name: obj.state_dict() for name, obj in self.components.items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict.get("parallel", {})
        for name, obj in self.components.items():
            if name in saved:
                obj.load_state_dict(saved[name])


class RNG(Stateful):
    """Every RNG of this process; restored only when the world size is unchanged (the
    streams belong to ranks, which do not map onto a different world)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size

    def state_dict(self) -> dict[str, Any]:
        return {"rng": rng_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("world_size") == self.world_size:
            set_rng_state(state_dict["rng"])


def per_rank_state(parts: list[Stateful]) -> dict[str, Any]:
    """The per-rank file's dict: every part's keys."""
    out: dict[str, Any] = {}
    for part in parts:
        out.update(part.state_dict())
    return out


def load_per_rank_state(parts: list[Stateful], state: dict[str, Any]) -> None:
    for part in parts:
        part.load_state_dict(state)
