"""``parallel.strategy=fsdp`` on a one-rank mesh: FSDP2's mixed precision without FSDP.

With one rank, ``fully_shard``'s all-gather and reduce-scatter move nothing between GPUs but
still cost a pass over memory each: every step casts every parameter into a gather buffer,
copies it out (again in backward when resharded after forward) and casts and copies every
gradient through a reduce buffer (12.9 ms of a 218 ms 1b step on one H200 in
``scripts/gpu/kernel_profile.py``; docs/performance.md, ``parallel.fsdp_one_rank``).
``parallel.fsdp_one_rank=cast`` (the default) keeps the numerics and drops the copies: the
forward runs on casts of the fp32 parameters to the FSDP parameter dtype (bf16), and
autograd sends each cast's gradient back to the fp32 parameter's ``.grad``, as FSDP's fp32
reduce does. Parameters, gradients, optimizer state and checkpoints stay fp32 and keep their
names (:func:`attach` says which cast happens where); on the CPU the trajectory equals
``fully_shard``'s on one rank bit for bit (tests/parallel/test_parallel_cast.py).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn


def cast_applies(job, dims, param_dtype) -> bool:
    """Whether a one-rank FSDP job takes this path instead of ``fully_shard``. Not with CPU
    offload (the point of which is FSDP's), nor with Transformer Engine's layers, which are
    not ``nn.Linear`` and keep their own weight handling."""
    pcfg = job.parallel
    return (dims.fsdp_enabled and dims.world_size == 1 and pcfg.fsdp_one_rank == "cast"
            and not pcfg.cpu_offload and job.fp8.backend != "te"
            and param_dtype is not None and param_dtype != torch.float32)


def attach(par, model: nn.Module, dtype: torch.dtype, recompute: bool, autocast: bool) -> None:
    """Install the casts. ``autocast``: the forward runs under autocast to ``dtype``.

    * Linear layers' weights (``autocast``): left to autocast, which casts them inside the
      compiled blocks; the cast weight is saved for backward like any activation.
    * Embeddings: cast for each call (forward hooks) and freed after it: the lookup's backward
      does not need the weight, as FSDP frees its embedding unit's gathered weight.
    * The rest (norm weights, the rope table): swapped around the forward, or around forward
      and backward when blocks are recomputed in backward (``recompute``: activation
      checkpointing), so that the recompute finds the same tensors."""
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            _cast_each_call(module, dtype)
    skip = (nn.Embedding, nn.Linear) if autocast else (nn.Embedding,)

    def context():
        return cast_parameters(model, dtype, skip)

    if recompute:
        par.micro_batch_context = context
    else:
        par.add_forward_context(context)


def _cast_each_call(module: nn.Module, dtype: torch.dtype) -> None:
    open_casts = []

    def swap_in(mod, args):
        ctx = cast_parameters(mod, dtype)
        ctx.__enter__()
        open_casts.append(ctx)

    def swap_out(mod, args, output):
        if open_casts:
            open_casts.pop().__exit__(None, None, None)

    module.register_forward_pre_hook(swap_in)
    module.register_forward_hook(swap_out, always_call=True)  # also when the forward raises


@contextlib.contextmanager
def cast_parameters(model: nn.Module, dtype: torch.dtype, skip: tuple[type, ...] = ()):
    """Within the block, every floating-point parameter and buffer of ``model`` is replaced by
    its cast to ``dtype`` (a tied parameter is cast once), modules of the ``skip`` types
    excepted; they are put back on exit. This is the swap ``torch.func.functional_call`` makes,
    kept open around the forward (:func:`attach`) so that the parameters, their names and the
    state dict are untouched outside it.
    Buffers too: FSDP2 casts the floating-point forward inputs of its units, and that is how
    the model's one floating-point buffer (the rope table) reaches every block."""
    slots = [(table, name, t) for m in model.modules() if not isinstance(m, skip) for table in (m._parameters, m._buffers)
             for name, t in table.items() if t is not None and t.is_floating_point() and t.dtype != dtype]
    casts: dict[int, torch.Tensor] = {}
    try:
        for table, name, t in slots:
            if id(t) not in casts:
                casts[id(t)] = t.to(dtype)
            table[name] = casts[id(t)]
        yield
    finally:
        for table, name, t in slots:
            table[name] = t
