"""Which ``scaled_dot_product_attention`` kernel runs (``parallel.sdpa_backend``).

The model calls ``F.scaled_dot_product_attention`` and knows nothing of kernels; the
trainer enters :func:`sdpa_backend` around the forward *and* the backward of each
micro-step. The backward matters for activation checkpointing: its recomputed forward
must pick the same kernel as the original one (otherwise the saved tensors differ).

``torch.nn.attention.sdpa_kernel`` sets process-wide flags (not thread-local: the
autograd engine's device threads see them too). Under ``torch.compile`` the kernel is
chosen when the graph is traced, i.e. at the first call, which happens inside this
context; dynamo does not guard on these flags, so a compiled block keeps the kernel it
was traced with (``train bench step`` resets dynamo between points).
"""

from __future__ import annotations

import contextlib

import torch

from train.errors import ConfigError

_CUDA_ONLY = ("cudnn", "efficient")


def sdpa_backend(name: str, device: torch.device) -> contextlib.AbstractContextManager:
    """A context manager restricting SDPA to one backend; ``auto`` leaves torch's choice."""
    if name == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if name in _CUDA_ONLY and device.type != "cuda":
        raise ConfigError(f"parallel.sdpa_backend={name}: needs a CUDA GPU (use auto, flash or math here)")
    backends = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }
    return sdpa_kernel(backends[name])
