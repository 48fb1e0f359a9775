"""Configuration of FP8 training (owned by ``train.precision``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Float8Config:
    backend: str = "none"  # none | torchao | te
    recipe: str = "tensorwise"  # torchao: tensorwise | rowwise | rowwise_with_gw_hp | mxfp8
    #                             te: delayed | current | mxfp8
    fsdp_float8_all_gather: bool = True  # torchao tensorwise + FSDP2 only

    def validate(self) -> None:
        from train.config import ConfigError

        recipes = {
            "none": None,
            "torchao": ("tensorwise", "rowwise", "rowwise_with_gw_hp", "mxfp8"),
            "te": ("delayed", "current", "mxfp8"),
        }
        if self.backend not in recipes:
            raise ConfigError(f"fp8.backend: must be none, torchao or te, got {self.backend!r}")
        valid = recipes[self.backend]
        if valid and self.recipe not in valid:
            raise ConfigError(f"fp8.recipe: {self.recipe!r} is not a {self.backend} recipe (valid: {', '.join(valid)})")
