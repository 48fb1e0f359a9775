"""Mixed precision for the training step: bf16/fp16 autocast and fp16 loss scaling."""

from __future__ import annotations

import contextlib

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def resolve_precision(requested: str, device: torch.device) -> str:
    """``auto`` means bf16 on CUDA GPUs and fp32 on the CPU."""
    if requested != "auto":
        if requested == "fp16" and device.type == "cpu":
            raise ValueError("train.precision=fp16 needs a CUDA GPU (use bf16 or fp32 on the CPU)")
        return requested
    return "bf16" if device.type == "cuda" else "fp32"


def autocast(precision: str, device: torch.device):
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[precision])


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler | None:
    """fp16 needs loss scaling to keep small gradients from flushing to zero."""
    if precision == "fp16":
        return torch.amp.GradScaler(device.type)
    return None
