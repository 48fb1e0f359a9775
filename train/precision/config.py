"""Configuration of FP8 training (owned by ``train.precision``)."""

from __future__ import annotations

from dataclasses import dataclass

RECIPES = {
    "torchao": ("tensorwise", "rowwise", "rowwise_with_gw_hp", "mxfp8"),
    "te": ("delayed", "current", "mxfp8"),
}
DEFAULT_RECIPE = {"torchao": "tensorwise", "te": "current"}


@dataclass
class Float8Config:
    backend: str = "none"  # none | torchao | te
    recipe: str = "auto"  # auto (torchao: tensorwise, te: current)
    #                       torchao: tensorwise | rowwise | rowwise_with_gw_hp | mxfp8
    #                       te: delayed | current | mxfp8
    # torchao tensorwise + FSDP2 only: all-gather weights in float8 (unset on CUDA: the plan's false, bf16)
    fsdp_float8_all_gather: bool = True

    @property
    def resolved_recipe(self) -> str:
        if self.recipe == "auto":
            return DEFAULT_RECIPE.get(self.backend, "")
        return self.recipe

    def validate(self) -> None:
        from train.errors import ConfigError

        if self.backend != "none" and self.backend not in RECIPES:
            raise ConfigError(f"fp8.backend: must be none, torchao or te, got {self.backend!r}")
        valid = RECIPES.get(self.backend)
        known = sorted({r for recipes in RECIPES.values() for r in recipes})
        if not valid and self.recipe != "auto" and self.recipe not in known:  # backend none: unused, but a typo
            raise ConfigError(f"fp8.recipe: {self.recipe!r} is no recipe of torchao or te (valid: auto, {', '.join(known)})")
        if valid and self.resolved_recipe not in valid:
            raise ConfigError(f"fp8.recipe: {self.recipe!r} is not a {self.backend} recipe (valid: {', '.join(valid)})")
