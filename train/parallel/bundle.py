"""What :func:`train.parallel.parallelize` returns: the wrapped model and what the loop needs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn


@dataclass
class Parallelized:
    model: nn.Module  # what forward() is called on (DDP wrapper, FSDP module...)
    inner: nn.Module  # the bare Transformer (for state-dict FQNs and init)
    dp_rank: int = 0
    dp_world: int = 1
    mesh: Any = None
    no_sync: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    after_optimizer_step: list[Callable[[], None]] = field(default_factory=list)
    extra_state: dict[str, Any] = field(default_factory=dict)  # name -> object with state_dict/load_state_dict
    # called once per step after it finished (synchronised); each returns metrics-row fields
    step_metrics: list[Callable[[], dict]] = field(default_factory=list)
    # entered around the model's forward only (e.g. Transformer Engine's FP8 autocast)
    forward_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    # entered around loss computation + backward (e.g. loss_parallel() for vocab-sharded logits)
    loss_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    # entered around each micro-batch's forward and backward, activation recompute included
    # (the one-rank parameter casts of train/parallel/cast.py)
    micro_batch_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    # global gradient norm (clipping when max_norm > 0); FSDP CPU offload installs its own
    clip_grad_norm: Callable[[Any, float], Any] = None  # type: ignore[assignment]

    def add_forward_context(self, factory: Callable[[], contextlib.AbstractContextManager]) -> None:
        """Enter ``factory()`` around the forward too, inside the contexts added before it."""
        outer = self.forward_context

        @contextlib.contextmanager
        def both():
            with outer(), factory():
                yield

        self.forward_context = factory if outer is contextlib.nullcontext else both

    def clip_grads(self, max_norm: float):
        """Global gradient norm of the model's parameters (DTensor-aware), clipped in place when ``max_norm`` > 0."""
        return (self.clip_grad_norm or clip_grad_norm)(list(self.model.parameters()), max_norm)

    def grad_norm(self):
        """Global gradient norm, gradients untouched (the optimizer applies the clip itself)."""
        if self.clip_grad_norm is not None:
            raise RuntimeError("this parallel setup computes its own gradient norm (clip_grads)")
        return clip_grad_norm(list(self.model.parameters()), 0.0)


def clip_grad_norm(params, max_norm: float):
    """torch's global gradient norm (a replicated DTensor's full value); clips when ``max_norm`` > 0
    (``max_norm`` <= 0: the norm alone, no pass over the gradients to scale them by 1)."""
    import torch

    if max_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None], foreach=True)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return norm
