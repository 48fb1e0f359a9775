"""Activation checkpointing of transformer blocks (``parallel.ac``).

* ``full``: every block recomputes its forward in the backward pass; only block inputs
  are kept.
* ``selective``: every ``ac_every``-th block (0, k, 2k, ...) is checkpointed.
* ``op``: every block, but op-level selective: outputs of the expensive ops (matmuls
  and attention, every second matmul excepted, as torchtitan does) are saved and only the
  cheap elementwise ops are recomputed (``torch.utils.checkpoint``'s
  ``create_selective_checkpoint_contexts``).
* ``pointwise``: as ``op`` but every matmul's output is saved: backward recomputes only the
  norms, RoPE, the residual adds and the SwiGLU product (a memory-bound pass over tensors it
  reads anyway). With ``ac_skip_last`` it trims a few blocks' activations at little cost.
* ``ac_skip_last`` = k (any mode): the last k blocks are not checkpointed. Backward reaches
  them first, while few gradients are held yet: with FSDP at 8b the step's peak is at the end
  of backward (parameters, optimizer state and every gradient), so the activations of the
  last blocks can fit under it and their recompute is saved.

Blocks (the container the model's spec names, ``ModelSpec.blocks``) are replaced by torch's
``checkpoint_wrapper``. That inserts
``_checkpoint_wrapped_module.`` into ``named_parameters()`` names, but
``torch.distributed.checkpoint.state_dict.get_state_dict`` (what train/checkpoint/manager.py
uses) strips it, so checkpoints load across ``ac`` settings (tested).
"""

from __future__ import annotations

import functools
from collections import defaultdict

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    checkpoint_wrapper,
)


def _save_list() -> set:
    """Ops whose outputs ``op`` mode keeps instead of recomputing."""
    aten = torch.ops.aten
    names = [
        "mm", "addmm", "bmm",
        "_scaled_mm",  # float8 matmuls
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "max",  # float8 amax: cheap to keep, a reduction to recompute
    ]
    ops = {getattr(aten, n).default for n in names if hasattr(aten, n)}
    c10d = getattr(torch.ops, "_c10d_functional", None)
    if c10d is not None and hasattr(c10d, "reduce_scatter_tensor"):
        ops.add(c10d.reduce_scatter_tensor.default)  # TP/SP collectives: never redo communication
    return ops


def _op_context(every_second_mm: bool = True):
    from torch.utils.checkpoint import (
        CheckpointPolicy,
        create_selective_checkpoint_contexts,
    )

    save = _save_list()
    mm = torch.ops.aten.mm.default
    counts: dict[str, int] = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        if func == mm and every_second_mm:
            # Count forward and recompute separately so both make the same decisions.
            key = "recompute" if ctx.is_recompute else "forward"
            counts[key] += 1
            if counts[key] % 2 == 0:  # recompute every second matmul: memory/compute balance
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def _wrap(block: nn.Module, mode: str) -> nn.Module:
    kwargs = {"preserve_rng_state": False}  # no dropout in the model: nothing random to replay
    if mode == "op":
        kwargs["context_fn"] = _op_context
    elif mode == "pointwise":
        kwargs["context_fn"] = functools.partial(_op_context, every_second_mm=False)
    return checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT, **kwargs)


def apply_ac(model: nn.Module, pcfg, spec=None) -> int:
    """Wrap the blocks of ``model`` in place; returns how many were wrapped. ``spec``: the
    model's :class:`~train.models.spec.ModelSpec` (by default :func:`~train.models.registry.spec_of` it)."""
    if pcfg.ac == "none":
        return 0
    from train.models.registry import spec_of

    spec = spec or spec_of(model)
    wrapped = 0
    blocks = spec.block_items(model)
    last = len(blocks) - pcfg.ac_skip_last  # ac_skip_last: the blocks from here on are left alone
    for i, (name, block) in enumerate(blocks):
        if (pcfg.ac == "selective" and i % pcfg.ac_every) or i >= last:
            continue
        spec.set_block(model, name, _wrap(block, pcfg.ac))
        wrapped += 1
    return wrapped

