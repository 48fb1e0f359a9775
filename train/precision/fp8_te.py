"""FP8 training with NVIDIA Transformer Engine (``fp8.backend=te``).

Run on 1 and 2 H200s with TE 2.20.2 built against torch 2.11 (``scripts/gpu/te.sh``,
docs/results/h200x2-te); the CPU tests skip where ``transformer_engine`` is not importable.

* The ``nn.Linear`` layers of the blocks (not the output projection, not layers whose
  dims are not multiples of 16) are swapped for ``transformer_engine.pytorch.Linear``
  from outside the model file. Parameter names (``weight``) are unchanged, and the swap
  happens on the meta device: the model's own ``init_weights`` fills them after
  ``to_empty``. TE 2.20 takes the device as the string ``"meta"`` only (given
  ``torch.device("meta")`` it allocates on the current GPU).
* With FSDP2 the ``te.Linear`` weights are sharded like any other (DTensor, bf16
  all-gather); the start-up line counts them.
* The forward pass runs under ``te.autocast(enabled=True, recipe=...)`` (the
  ``fp8_autocast`` name is deprecated since TE 2.9), returned by
  :func:`forward_context` and entered by the trainer around the model call only.
* Recipes (``transformer_engine.common.recipe``): ``delayed`` = ``DelayedScaling``
  (amax history; amaxes reduced over the data-parallel group), ``current`` =
  ``Float8CurrentScaling``, ``mxfp8`` = ``MXFP8BlockScaling`` (sm_100 only: TE's MXFP8
  does not run on sm_120 RTX Pro 6000, where ``current`` is the choice).
* Not supported together with DTensor tensor parallelism (TE has its own TP),
  ``torch.compile``, or torch's activation checkpointing (the recompute would run outside
  ``te.autocast``; TE has its own ``te.distributed.checkpoint``). Set by the job, each is
  rejected before start-up; left open, the automatic plan keeps compile off and every block
  out of AC, or stops the run with one line where the blocks' activations do not fit.
"""

from __future__ import annotations

import torch
from torch import nn

from train.precision.fp8_torchao import module_filter


def make_recipe(name: str):
    from transformer_engine.common import recipe

    if name == "delayed":
        return recipe.DelayedScaling(fp8_format=recipe.Format.HYBRID, amax_history_len=16, amax_compute_algo="max")
    if name == "current":
        return recipe.Float8CurrentScaling(fp8_format=recipe.Format.HYBRID)
    if name == "mxfp8":
        return recipe.MXFP8BlockScaling(fp8_format=recipe.Format.E4M3)
    raise ValueError(f"fp8.recipe: {name!r} is not a Transformer Engine recipe (delayed, current, mxfp8)")


def _te_linear(linear: nn.Linear, device) -> nn.Module:
    import transformer_engine.pytorch as te

    return te.Linear(
        linear.in_features, linear.out_features, bias=linear.bias is not None,
        params_dtype=linear.weight.dtype, device=str(device),
    )


def convert(model: nn.Module, high_precision: tuple[str, ...] = ("output",)) -> nn.Module:
    """Swap eligible ``nn.Linear`` layers for ``te.Linear`` in place (``high_precision``: the
    names left alone); returns ``model``."""
    keep = module_filter(16, keep=high_precision)
    for fqn, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            child_fqn = f"{fqn}.{child_name}" if fqn else child_name
            if type(child) is nn.Linear and keep(child, child_fqn):
                setattr(module, child_name, _te_linear(child, child.weight.device))
    return model


def te_linears(model: nn.Module) -> list[tuple[str, nn.Module]]:
    try:
        import transformer_engine.pytorch as te
    except ImportError:
        return []
    return [(name, m) for name, m in model.named_modules() if isinstance(m, te.Linear)]


def forward_context(recipe_name: str):
    """A zero-argument callable returning the ``te.autocast`` context for one forward."""
    import transformer_engine.pytorch as te

    fp8_recipe = make_recipe(recipe_name)
    autocast = getattr(te, "autocast", None)

    def context():
        group = None
        if recipe_name == "delayed" and torch.distributed.is_available() and torch.distributed.is_initialized():
            group = torch.distributed.group.WORLD
        if autocast is not None:
            return autocast(enabled=True, recipe=fp8_recipe, amax_reduction_group=group)
        return te.fp8_autocast(enabled=True, fp8_recipe=fp8_recipe, fp8_group=group)  # TE < 2.9

    return context
