"""FSDP2 (``torch.distributed.fsdp.fully_shard``): FSDP, HSDP and FSDP + TP.

Order of operations (torchtitan's): mesh -> TP -> activation checkpointing -> compile ->
``fully_shard`` on the embedding, every block and the output (the units the model's spec names),
then on the root -> materialize. The model is still on
the meta device when it is sharded; ``materialize`` then allocates only this rank's
shards (``to_empty``) and ``init_weights`` fills them from the same full tensors a
single process would draw, so the values do not depend on the mesh (tested).

* Mixed precision: ``MixedPrecisionPolicy``: unsharded params in ``fsdp_param_dtype``
  (auto = the training precision), gradients reduced in ``fsdp_reduce_dtype`` (fp32).
  Sharded params and optimizer state stay fp32.
* ``reshard_after_forward``: auto frees every block's gathered params after its
  forward except the last block's (backward needs them at once); ``never`` keeps them
  (more memory, no re-gather in backward); ``always`` frees all. The embedding's are freed
  after forward in every mode and not gathered for backward, which reads only the token ids
  and the output gradient (``FSDPModule.set_unshard_in_backward``; a torch without it keeps
  the mode's rule).
* ``cpu_offload``: ``CPUOffloadPolicy`` (params/grads/optimizer state on the host; the
  optimizer step runs on the CPU). Weights are then initialised on the CPU, by the CPU
  generator: same seed, different (equally distributed) values than a GPU-initialised run.
  The gradient norm of host-resident DTensor grads is reduced on the GPU
  (:func:`clip_host_sharded_grads_`; NCCL cannot reduce CPU tensors).
* ``fsdp_prefetch`` = k: block i all-gathers blocks i+1..i+k at the start of its
  forward and blocks i-1..i-k at the start of its backward, instead of relying on the
  CPU running ahead.
* Gradient accumulation: ``no_sync`` turns off gradient reduction
  (``set_requires_gradient_sync(False)``) for the non-final micro-steps.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)

from train.parallel.ac import apply_ac
from train.parallel.bundle import Parallelized, clip_grad_norm
from train.parallel.compile import apply_compile
from train.parallel.dims import ParallelDims
from train.parallel.mesh import build_mesh
from train.parallel.symm_comm import apply_symm_mem
from train.parallel.tp import apply_tp
from train.precision.amp import resolve_precision

_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def param_dtype(pcfg, precision: str) -> torch.dtype | None:
    """The dtype of the unsharded parameters in forward and backward (None: as stored, fp32)."""
    if pcfg.fsdp_param_dtype == "auto":
        return torch.bfloat16 if precision == "bf16" else None
    return _DTYPES[pcfg.fsdp_param_dtype]


def mixed_precision_policy(pcfg, precision: str) -> MixedPrecisionPolicy:
    return MixedPrecisionPolicy(param_dtype=param_dtype(pcfg, precision), reduce_dtype=_DTYPES[pcfg.fsdp_reduce_dtype])


def _reshard_policy(mode: str, index: int, n_blocks: int) -> bool:
    if mode == "always":
        return True
    if mode == "never":
        return False
    return index < n_blocks - 1


def _set_prefetch(model: nn.Module, blocks: list[nn.Module], k: int) -> None:
    if k <= 0:
        return
    model.set_modules_to_forward_prefetch(blocks[:1])
    for i, block in enumerate(blocks):
        ahead = blocks[i + 1:i + 1 + k]
        behind = list(reversed(blocks[max(0, i - k):i]))
        if ahead:
            block.set_modules_to_forward_prefetch(ahead)
        if behind:
            block.set_modules_to_backward_prefetch(behind)


@contextlib.contextmanager
def _no_sync(model):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def shard_model(model: nn.Module, fsdp_mesh, job, precision: str, spec=None) -> None:
    """``fully_shard`` the embedding, each block and the output projection as units of
    their own (``spec.embedding``, ``spec.blocks``, ``spec.output``; None: in the root), then
    the root (final norm, and whatever the spec leaves there).

    Own units free the embedding's gathered weight after its forward and reduce-scatter
    the output projection's gradient as soon as its backward is done, instead of holding
    both (gathered weights and full-size gradients) through the whole step in the root.
    ``train.loss=chunked`` runs through the output module too (``Output.forward(h,
    targets)``), so its unit works the same way there. Tied weights (one parameter in the
    embedding and the output) keep both in the root: a parameter belongs to one unit."""
    from train.models.registry import spec_of

    spec = spec or spec_of(model)
    pcfg = job.parallel
    kwargs = {
        "mesh": fsdp_mesh,
        "mp_policy": mixed_precision_policy(pcfg, precision),
        "offload_policy": CPUOffloadPolicy() if pcfg.cpu_offload else OffloadPolicy(),
    }
    reshard_all = pcfg.reshard_after_forward == "always"
    embedding = model.get_submodule(spec.embedding) if spec.embedding else None
    output = model.get_submodule(spec.output) if spec.output else None
    if embedding is not None:
        # freed after forward where backward does not gather it again (else as the mode says)
        no_gather = hasattr(FSDPModule, "set_unshard_in_backward")
        fully_shard(embedding, reshard_after_forward=no_gather or pcfg.reshard_after_forward != "never", **kwargs)
        if no_gather:
            embedding.set_unshard_in_backward(False)
    blocks = [block for _, block in spec.block_items(model)]
    for i, block in enumerate(blocks):
        fully_shard(block, reshard_after_forward=_reshard_policy(pcfg.reshard_after_forward, i, len(blocks)), **kwargs)
    # The output projection's params are needed right at the start of backward.
    if output is not None:
        fully_shard(output, reshard_after_forward=reshard_all, **kwargs)
    fully_shard(model, reshard_after_forward=reshard_all, **kwargs)
    _set_prefetch(model, blocks, pcfg.fsdp_prefetch)
    units = [m for m in (embedding, *blocks, output, model) if m is not None]
    apply_symm_mem(units, job, fsdp_mesh.device_type, fsdp_mesh.get_group(fsdp_mesh.ndim - 1),
                   kwargs["mp_policy"].param_dtype)


def apply_fsdp(model: nn.Module, job, info, materialize, dims: ParallelDims, spec=None):
    """Shard ``model`` over ``dims`` (fp16 with FSDP is refused by :meth:`ParallelDims.from_job`).
    ``spec``: the model's :class:`~train.models.spec.ModelSpec` (by default its config's)."""
    from train.models.registry import spec_of

    spec = spec or spec_of(model)
    pcfg = job.parallel
    precision = resolve_precision(job.train.precision, info.device)
    mesh = build_mesh(dims, info.device.type)
    if mesh.tp > 1:
        apply_tp(model, mesh.tp_mesh, pcfg.sequence_parallel, pcfg.loss_parallel, spec)
    apply_ac(model, pcfg, spec)
    apply_compile(model, pcfg, spec)
    shard_model(model, mesh.fsdp_mesh, job, precision, spec)
    if pcfg.cpu_offload:
        _materialize_offloaded(model, job.train.seed, info.device, spec)
    else:
        materialize(model)

    par = Parallelized(
        model=model, inner=model, dp_rank=mesh.dp_rank, dp_world=mesh.dp_world, mesh=mesh,
        no_sync=lambda: _no_sync(model),
    )
    if pcfg.cpu_offload:
        par.clip_grad_norm = clip_offloaded_grad_norm
    if mesh.tp > 1 and pcfg.loss_parallel:
        from torch.distributed.tensor.parallel import loss_parallel

        par.loss_context = loss_parallel
    return par


def _materialize_offloaded(model: nn.Module, seed: int, device: torch.device, spec) -> None:
    """CPU offload: sharded params live on the host; buffers (RoPE table) on the GPU."""
    model.to_empty(device="cpu")
    spec.init_weights(model, seed)
    for mod in model.modules():
        for name, buf in list(mod.named_buffers(recurse=False)):
            setattr(mod, name, buf.to(device))


# ----------------------------------------------------------------------------- CPU offload
def clip_offloaded_grad_norm(params, max_norm: float) -> torch.Tensor:
    """The gradient norm for FSDP CPU offload: NCCL cannot reduce host-resident grads."""
    params = list(params)
    if host_sharded_grads(params):
        return clip_host_sharded_grads_(params, max_norm)
    return clip_grad_norm(params, max_norm)


def host_sharded_grads(params) -> bool:
    """True when gradients are DTensors held in host memory on an accelerator mesh (FSDP
    CPU offload): torch's clip_grad_norm_ would all-reduce CPU tensors over NCCL and fail
    ("No backend type associated with device type cpu")."""
    from torch.distributed.tensor import DTensor

    for p in params:
        g = p.grad
        if isinstance(g, DTensor):
            return g.device_mesh.device_type != "cpu" and g.to_local().device.type == "cpu"
    return False


def clip_host_sharded_grads_(params, max_norm: float) -> torch.Tensor:
    """Global L2 norm of (possibly host-resident) DTensor gradients, clipped in place when
    ``max_norm`` > 0; returns the norm on the mesh's device. Each gradient's local sum of
    squares is all-reduced, on the mesh's device, over the mesh dims it is sharded on
    (not over replicated ones), as DTensor would; then every local shard is scaled."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    buckets: dict[tuple, torch.Tensor] = {}
    device = torch.device("cpu")
    for g in grads:
        if isinstance(g, DTensor):
            if any(pl.is_partial() for pl in g.placements):
                raise NotImplementedError("gradient norm of Partial DTensor gradients in host memory")
            key = (g.device_mesh, tuple(i for i, pl in enumerate(g.placements) if pl.is_shard()))
            if g.device_mesh.device_type != "cpu":
                device = torch.device(g.device_mesh.device_type, torch.cuda.current_device())
            local = g.to_local()
        else:
            key, local = (None, ()), g
        sq = torch.linalg.vector_norm(local, dtype=torch.float32).square()
        buckets[key] = buckets[key] + sq if key in buckets else sq
    total = torch.zeros((), dtype=torch.float32, device=device)
    for (mesh, dims), sq in buckets.items():
        sq = sq.to(device)
        for dim in dims:
            dist.all_reduce(sq, group=mesh.get_group(dim))
        total += sq
    norm = total.sqrt()
    if max_norm > 0 and grads:
        coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        locals_ = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
        torch._foreach_mul_(locals_, coef.to(locals_[0].device))
    return norm
