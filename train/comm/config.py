"""Configuration of gradient communication (owned by ``train.comm``).

``hook`` picks how DDP exchanges gradients:

* ``none``: DDP's built-in all-reduce (full precision).
* ``fp16`` / ``bf16``: torch's ``default_hooks`` (half the bytes).
* ``powersgd``: PowerSGD (low-rank, error feedback, warm start); ``powersgd_impl`` picks
  our sync-free hook (``train``) or torch's ``powerSGD_hook`` (``torch``).
* ``topk``: Top-K sparsification with error feedback (``train.comm.topk``).
* ``localsgd``: no gradient exchange after a warm-up; parameters are averaged every
  ``localsgd_period`` optimizer steps (torch's post-local SGD + PeriodicModelAverager).
"""

from __future__ import annotations

from dataclasses import dataclass

HOOKS = ("none", "fp16", "bf16", "powersgd", "topk", "localsgd")


@dataclass
class CommConfig:
    hook: str = "none"  # none | fp16 | bf16 | powersgd | topk | localsgd
    powersgd_rank: int = 4  # matrix_approximation_rank
    powersgd_start_iter: int = 10  # plain all-reduce before this step (>= 2: DDP rebuilds buckets after step 1)
    powersgd_warm_start: bool = True
    # torch: torch's powerSGD_hook (default: 257.8 vs 290.8 ms/step on 2xH200 at 10 Gbit/s,
    # docs/results/h200x2-slowlink) | train: our hook without the per-bucket synchronize
    powersgd_impl: str = "torch"
    topk_ratio: float = 0.01  # fraction of each bucket's elements sent per step
    topk_start_iter: int = 10  # plain all-reduce before this step (>= 2, as for PowerSGD)
    localsgd_period: int = 4  # optimizer steps between parameter averages
    localsgd_warmup: int = 10  # plain DDP (gradient all-reduce) for this many steps first
    measure: bool = False  # per-step comm_bytes and exposed_comm_ms in metrics.jsonl

    def validate(self) -> None:
        from train.errors import ConfigError

        if self.hook not in HOOKS:
            raise ConfigError(f"comm.hook: must be one of {', '.join(HOOKS)}, got {self.hook!r}")
        if self.powersgd_impl not in ("train", "torch"):
            raise ConfigError(f"comm.powersgd_impl: must be train or torch, got {self.powersgd_impl!r}")
        if self.powersgd_rank < 1:
            raise ConfigError(f"comm.powersgd_rank: must be >= 1, got {self.powersgd_rank}")
        for name in ("powersgd_start_iter", "topk_start_iter"):
            if getattr(self, name) < 2:
                raise ConfigError(
                    f"comm.{name}: must be >= 2 (DDP rebuilds its gradient buckets after the first step, "
                    f"and the compression state is kept per bucket), got {getattr(self, name)}"
                )
        if self.localsgd_warmup < 0:
            raise ConfigError(f"comm.localsgd_warmup: must be >= 0, got {self.localsgd_warmup}")
        if not 0 < self.topk_ratio <= 1:
            raise ConfigError(f"comm.topk_ratio: must be in (0, 1], got {self.topk_ratio}")
        if self.localsgd_period < 1:
            raise ConfigError(f"comm.localsgd_period: must be >= 1, got {self.localsgd_period}")
