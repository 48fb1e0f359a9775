"""AdamW and the warmup + cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch


def build_optimizer(model: torch.nn.Module, cfg, device: torch.device) -> torch.optim.Optimizer:
    """AdamW; no weight decay on norms and 1-D parameters; fused kernel on CUDA (and with ``optim.clip_in_step``)."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # optim.clip_in_step needs the fused kernel's grad_scale: fused on the CPU too then
    return torch.optim.AdamW(
        groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
        fused=device.type == "cuda" or cfg.clip_in_step,
    )


def device_gated(optimizer: torch.optim.Optimizer, scaler, par) -> bool:
    """Whether the step can be queued before the host reads the step's agreement: only torch's
    fused AdamW takes ``found_inf`` (and ``grad_scale``), no GradScaler (fp16) may claim those
    slots, and the step must run on the device's tensors (not FSDP CPU offload, which installs
    its own ``clip_grad_norm``)."""
    return scaler is None and par.clip_grad_norm is None and all(g.get("fused") for g in optimizer.param_groups)


def clip_in_step(cfg, gated: bool) -> bool:
    """Whether the gradient clip goes into the fused AdamW kernel (``optim.clip_in_step``): it
    divides every gradient by its ``grad_scale``; needs a ``device_gated`` step."""
    return bool(gated and cfg.clip_in_step and cfg.grad_clip > 0)


def clip_divisor(norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """The fused AdamW ``grad_scale`` that clips: every gradient is divided by
    max(1, (norm + 1e-6) / max_norm), i.e. multiplied by torch's clip coefficient
    ``clamp(max_norm / (norm + 1e-6), max=1)`` (``clip_grads_with_norm_``)."""
    return torch.clamp((norm.float() + 1e-6) / max_norm, min=1.0)


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
