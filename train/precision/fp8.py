"""FP8 training: dispatch to the torchao or Transformer Engine backend."""

from __future__ import annotations


def apply_float8(model, cfg, device, parallel_cfg):
    if cfg.backend == "none":
        return model
    raise NotImplementedError(f"fp8.backend={cfg.backend} is not available in this build")
