"""Apply parallelism to a model from outside: the model file knows nothing of it.

``parallelize`` takes the bare model (possibly on the meta device) and returns a
:class:`Parallelized` bundle: the wrapped model plus what the training loop needs to
drive it (data-parallel rank/size, a no-sync context for gradient accumulation, hooks
to run after each optimizer step, extra checkpoint state).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from train.parallel.dims import ParallelDims

if TYPE_CHECKING:
    from torch import nn

    from train.parallel.bundle import Parallelized

__all__ = ["ParallelDims", "Parallelized", "clip_grad_norm", "parallelize"]


def __getattr__(name: str):
    """``Parallelized`` and ``clip_grad_norm`` (torch) load on first use: the ``parallel`` config
    section is read without importing torch (``train --help``, ``launch``-side checks)."""
    if name in ("Parallelized", "clip_grad_norm"):
        from train.parallel import bundle

        return getattr(bundle, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def parallelize(model: nn.Module, job, info, materialize: Callable[[nn.Module], None],
                dims: ParallelDims | None = None, spec=None) -> Parallelized:
    """``materialize(model)`` allocates real storage and initialises weights; each
    strategy calls it at the right moment (before DDP wraps, after FSDP shards).
    ``dims``: the run's resolved dims (made from ``job`` and ``info`` when not given).
    ``spec``: the model's :class:`~train.models.spec.ModelSpec` (its blocks, FSDP2 units and
    tensor-parallel plan; by default the one of ``job.model``)."""
    from train.models.registry import model_spec
    from train.parallel import cast, ddp, fsdp
    from train.parallel.ac import apply_ac
    from train.parallel.bundle import Parallelized
    from train.parallel.compile import apply_compile
    from train.precision.amp import resolve_precision
    from train.precision.fp8 import attach_float8

    if dims is None:
        dims = ParallelDims.from_job(job, info.world_size)
    spec = spec or model_spec(job.model)
    precision = resolve_precision(job.train.precision, info.device)
    dtype = fsdp.param_dtype(job.parallel, precision)
    one_rank = cast.cast_applies(job, dims, dtype)
    if info.backend is None or not dims.fsdp_enabled or one_rank:
        # One process or rank (nothing to wrap or shard) or DDP: checkpointing and compile go
        # on the bare blocks first. FSDP applies them itself, after TP and before sharding.
        apply_ac(model, job.parallel, spec)
        apply_compile(model, job.parallel, spec)
    if one_rank or info.backend is None:
        materialize(model)
        par = Parallelized(model=model, inner=model)
        if one_rank:  # FSDP's mixed precision without its one-rank copies (train/parallel/cast.py)
            cast.attach(par, model, dtype, recompute=job.parallel.ac != "none", autocast=precision == "bf16")
    elif dims.fsdp_enabled:
        par = fsdp.apply_fsdp(model, job, info, materialize, dims, spec)
    else:
        par = ddp.apply_ddp(model, job, info, materialize, dims)
    attach_float8(par, job.fp8)
    return par
