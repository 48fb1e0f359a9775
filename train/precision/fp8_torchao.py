"""FP8 training with torchao (``fp8.backend=torchao``).

* ``tensorwise`` / ``rowwise`` / ``rowwise_with_gw_hp``: ``nn.Linear`` layers of the
  blocks become ``torchao.float8.Float8Linear`` (``convert_to_float8_training`` with
  ``Float8LinearConfig.from_recipe_name``). With FSDP2 and ``tensorwise`` the weights are
  all-gathered in float8 (``enable_fsdp_float8_all_gather``); their scales are then
  computed for all layers in one all-reduce after each optimizer step
  (``precompute_float8_dynamic_scale_for_fsdp``, hooked on ``par.after_optimizer_step``).
* ``mxfp8`` (sm_100 only): torchao 0.17's MX training API,
  ``torchao.quantization.quantize_`` with
  ``torchao.prototype.moe_training.config.MXFP8TrainingOpConfig`` (recipe
  ``MXFP8_RCEIL``), which wraps the weights of the selected ``nn.Linear`` layers so
  their matmuls run as dynamically quantized MXFP8 GEMMs.

The module filter keeps the output projection (the model spec's ``high_precision``, Llama's
``output``: large vocabulary logits are sensitive to quantization) and every layer whose
dims are not multiples of 16 (32 for MXFP8 blocks; times the TP degree, since shards must satisfy it too) in high precision.
"""

from __future__ import annotations

import dataclasses

from torch import nn

KEEP_HIGH_PRECISION = ("output",)


def module_filter(multiple: int = 16, tp: int = 1, keep: tuple[str, ...] = KEEP_HIGH_PRECISION):
    """``filter(module, fqn) -> bool``: True for the linears to convert; ``keep``: the names of
    linears left in high precision (the model spec's ``high_precision``)."""
    step = multiple * tp

    def keep_fp8(module: nn.Module, fqn: str) -> bool:
        if not isinstance(module, nn.Linear) or fqn in keep:
            return False
        return module.in_features % step == 0 and module.out_features % step == 0

    return keep_fp8


def float8_config(recipe: str, fsdp_float8_all_gather: bool = False, emulate: bool = False):
    from torchao.float8 import Float8LinearConfig

    config = Float8LinearConfig.from_recipe_name(recipe)
    changes = {}
    if fsdp_float8_all_gather and recipe == "tensorwise":
        changes["enable_fsdp_float8_all_gather"] = True
    if emulate:  # matmuls in high precision on float8-rounded values: CPU tests only
        changes["emulate"] = True
    return dataclasses.replace(config, **changes) if changes else config


def convert(model: nn.Module, recipe: str, tp: int = 1, fsdp_float8_all_gather: bool = False,
            emulate: bool = False, keep: tuple[str, ...] = KEEP_HIGH_PRECISION) -> nn.Module:
    """Convert ``model`` in place (works on the meta device); returns it."""
    if recipe == "mxfp8":
        return _convert_mxfp8(model, tp, keep)
    from torchao.float8 import convert_to_float8_training

    return convert_to_float8_training(
        model, module_filter_fn=module_filter(16, tp, keep),
        config=float8_config(recipe, fsdp_float8_all_gather, emulate),
    )


def _convert_mxfp8(model: nn.Module, tp: int, keep: tuple[str, ...]) -> nn.Module:
    from torchao.prototype.moe_training.config import (
        MXFP8TrainingOpConfig,
        MXFP8TrainingRecipe,
    )
    from torchao.quantization import quantize_

    config = MXFP8TrainingOpConfig.from_recipe(MXFP8TrainingRecipe.MXFP8_RCEIL)
    quantize_(model, config, filter_fn=module_filter(32, tp, keep))
    return model


def float8_linears(model: nn.Module) -> list[tuple[str, nn.Module]]:
    try:
        from torchao.float8.float8_linear import Float8Linear
    except ImportError:
        return []
    return [(name, m) for name, m in model.named_modules() if isinstance(m, Float8Linear)]


def uses_float8_tensorwise(model: nn.Module) -> bool:
    """True when the model holds tensorwise-scaled ``Float8Linear`` layers."""
    from_torchao = float8_linears(model)
    if not from_torchao:
        return False
    from torchao.float8.config import ScalingGranularity

    cfg = from_torchao[0][1].config
    return cfg.cast_config_weight.scaling_granularity is ScalingGranularity.TENSORWISE and (
        cfg.cast_config_input.scaling_granularity is ScalingGranularity.TENSORWISE
    )


def uses_fsdp_float8_all_gather(model: nn.Module) -> bool:
    return any(m.config.enable_fsdp_float8_all_gather for _, m in float8_linears(model))


def precompute_scales_hook(model: nn.Module):
    """After each optimizer step: float8 scales of all FSDP-sharded weights in one
    all-reduce (instead of one per layer in the next forward)."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    def hook() -> None:
        precompute_float8_dynamic_scale_for_fsdp(model)

    return hook
