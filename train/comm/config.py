"""Configuration of gradient communication (owned by ``train.comm``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CommConfig:
    hook: str = "none"  # none | fp16 | bf16 | powersgd | topk | localsgd
    powersgd_rank: int = 4
    powersgd_start_iter: int = 10
    powersgd_warm_start: bool = True
    topk_ratio: float = 0.01
    localsgd_period: int = 4
    localsgd_warmup: int = 10

    def validate(self) -> None:
        from train.config import ConfigError

        hooks = ("none", "fp16", "bf16", "powersgd", "topk", "localsgd")
        if self.hook not in hooks:
            raise ConfigError(f"comm.hook: must be one of {', '.join(hooks)}, got {self.hook!r}")
        if self.powersgd_rank < 1:
            raise ConfigError(f"comm.powersgd_rank: must be >= 1, got {self.powersgd_rank}")
        if self.powersgd_start_iter < 0 or self.localsgd_warmup < 0:
            raise ConfigError("comm.powersgd_start_iter / comm.localsgd_warmup: must be >= 0")
        if not 0 < self.topk_ratio <= 1:
            raise ConfigError(f"comm.topk_ratio: must be in (0, 1], got {self.topk_ratio}")
        if self.localsgd_period < 1:
            raise ConfigError(f"comm.localsgd_period: must be >= 1, got {self.localsgd_period}")
