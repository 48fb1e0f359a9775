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
    # called once per step after it finished (synchronised); each returns metrics-row fields
    step_metrics: list[Callable[[], dict]] = field(default_factory=list)
    # entered around the model's forward only (e.g. Transformer Engine's FP8 autocast)
    forward_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    # entered around loss computation + backward (e.g. loss_parallel() for vocab-sharded logits)
    loss_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext


def parallelize(model: nn.Module, job, info, materialize: Callable[[nn.Module], None]) -> Parallelized:
    """``materialize(model)`` allocates real storage and initialises weights; each
    strategy calls it at the right moment (before DDP wraps, after FSDP shards)."""
    from train.parallel import ddp, fsdp
    from train.parallel.ac import apply_ac
    from train.parallel.compile import apply_compile
    from train.precision.fp8 import attach_float8

    if info.backend is None or job.parallel.strategy == "ddp":
        # One process (nothing to wrap) or DDP: checkpointing and compile go on the bare
        # blocks first. FSDP applies them itself, after TP and before sharding.
        apply_ac(model, job.parallel)
        apply_compile(model, job.parallel)
    if info.backend is None:
        materialize(model)
        par = Parallelized(model=model, inner=model)
    else:
        strategies = {"ddp": ddp.apply_ddp, "fsdp": fsdp.apply_fsdp}
        try:
            apply = strategies[job.parallel.strategy]
        except KeyError:
            raise NotImplementedError(f"parallel.strategy={job.parallel.strategy} is not available in this build") from None
        par = apply(model, job, info, materialize)
    attach_float8(par, job.fp8)
    return par
