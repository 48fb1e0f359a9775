"""Apply parallelism to a model from outside: the model file knows nothing of it.

``parallelize`` takes the bare model (possibly on the meta device) and returns a
:class:`Parallelized` bundle: the wrapped model plus what the training loop needs to
drive it (data-parallel rank/size, a no-sync context for gradient accumulation, hooks
to run after each optimizer step, extra checkpoint state).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable

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


def parallelize(model: nn.Module, job, info, materialize: Callable[[nn.Module], None]) -> Parallelized:
    """``materialize(model)`` allocates real storage and initialises weights; each
    strategy calls it at the right moment (before DDP wraps, after FSDP shards)."""
    from train.parallel import ddp

    if info.backend is None:  # one process: nothing to wrap
        materialize(model)
        return Parallelized(model=model, inner=model)
    strategies = {"ddp": ddp.apply_ddp}
    try:
        apply = strategies[job.parallel.strategy]
    except KeyError:
        raise NotImplementedError(f"parallel.strategy={job.parallel.strategy} is not available in this build") from None
    return apply(model, job, info, materialize)
