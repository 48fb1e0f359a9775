"""AdamW and the warmup + cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch


def build_optimizer(model: torch.nn.Module, cfg, device: torch.device) -> torch.optim.Optimizer:
    """AdamW; no weight decay on norms and 1-D parameters; fused kernel on CUDA."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
        fused=device.type == "cuda",
    )


def lr_lambda(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup to 1 over ``warmup`` steps, then cosine decay to ``min_ratio``."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_lambda(s, cfg.warmup_steps, total_steps, cfg.min_lr_ratio)
    )
