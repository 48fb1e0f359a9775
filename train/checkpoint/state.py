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

from core.safety import excerpt

# ----------------------------------------------------------------------------- checks
# A per-rank file is read back with weights_only=True, so it holds plain values; these checks
# make one of the wrong type or range a ValueError naming the key (``Checkpointer.resume`` turns
# it into one line naming the file) instead of a traceback or a silently wrong run.


def shown(value: object) -> str:
    """A value of a per-rank file for a message: numbers as written, anything else quoted."""
    return repr(value)[:40] if isinstance(value, (int, float)) else excerpt(value)


def count(state: dict, key: str, default: int | None = None, hi: int = 1 << 62) -> int:
    """``state[key]`` as a non-negative integer below ``hi`` (``default`` when absent, if given)."""
    value = state.get(key, default) if default is not None else state[key]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < hi:
        raise ValueError(f"{key}={shown(value)} is not an integer in 0..{hi - 1}")
    return value


def _floats(value, key: str, n: int) -> None:
    if not isinstance(value, (list, tuple)) or len(value) != n or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) for v in value):
        raise ValueError(f"{key} must be {n} finite number(s) (one per parameter group), got {excerpt(value)}")


def _tensor(value, key: str, like: torch.Tensor) -> None:
    if not isinstance(value, torch.Tensor) or value.dtype != like.dtype or value.shape != like.shape:
        got = f"{value.dtype} {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(f"{key} must be a {like.dtype} tensor of shape {tuple(like.shape)}, got {got}")


def check_rng_state(state: dict) -> None:
    """The shapes and ranges :func:`set_rng_state` needs (torch, numpy, Python, CUDA)."""
    _tensor(state["torch"], "rng.torch", torch.get_rng_state())
    npst = state["numpy"]
    if npst["name"] != "MT19937":
        raise ValueError(f"rng.numpy.name={excerpt(npst['name'])} is not MT19937")
    keys = npst["keys"]
    if not isinstance(keys, torch.Tensor) or keys.shape != (624,) or keys.is_floating_point() \
            or (keys.numel() and (int(keys.min()) < 0 or int(keys.max()) >= 1 << 32)):
        raise ValueError("rng.numpy.keys must be 624 integers in 0..2**32-1")
    count(npst, "pos", hi=625)
    count(npst, "has_gauss", hi=2)
    if not isinstance(npst["cached_gaussian"], float):
        raise ValueError(f"rng.numpy.cached_gaussian={excerpt(npst['cached_gaussian'])} is not a float")
    py = state["python"]
    if not (isinstance(py, (tuple, list)) and len(py) == 3 and py[0] == 3 and isinstance(py[1], (tuple, list))
            and len(py[1]) == 625 and all(isinstance(v, int) and 0 <= v < 1 << 32 for v in py[1][:624])
            and isinstance(py[1][624], int) and 0 <= py[1][624] <= 624 and (py[2] is None or isinstance(py[2], float))):
        raise ValueError("rng.python is not a Mersenne Twister state (version 3, 625 words)")
    cuda = state.get("cuda")  # checked without touching CUDA (a CPU run on a GPU node makes no context)
    if cuda is not None and not (isinstance(cuda, torch.Tensor) and cuda.dtype == torch.uint8 and cuda.dim() == 1):
        raise ValueError("rng.cuda must be a 1-D uint8 tensor (a CUDA generator's state)")


def check_scheduler_state(state, groups: int) -> None:
    """A ``LambdaLR`` state of an optimizer with ``groups`` parameter groups."""
    if not isinstance(state, dict):
        raise ValueError(f"scheduler is a {type(state).__name__}, not a dict")
    _floats(state.get("base_lrs"), "scheduler.base_lrs", groups)
    if "_last_lr" in state:
        _floats(state["_last_lr"], "scheduler._last_lr", groups)
    count(state, "last_epoch")
    count(state, "_step_count", 0)
    lambdas = state.get("lr_lambdas", [None] * groups)
    if not isinstance(lambdas, (list, tuple)) or len(lambdas) != groups or any(x is not None for x in lambdas):
        raise ValueError(f"scheduler.lr_lambdas must be {groups} None (the schedule is code), got {excerpt(lambdas)}")


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
    check_rng_state(state)
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
        self.step = count(state_dict, "step")
        self.nan_skips = count(state_dict, "nan_skips", 0)


class Schedule(Stateful):
    """The learning-rate scheduler and (fp16) the gradient scaler."""

    def __init__(self, scheduler, scaler=None) -> None:
        self.scheduler = scheduler
        self.scaler = scaler

    def state_dict(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler is not None else None}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        check_scheduler_state(state_dict["scheduler"], len(self.scheduler.optimizer.param_groups))
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
