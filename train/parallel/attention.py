"""How attention runs: which ``scaled_dot_product_attention`` kernel (``parallel.sdpa_backend``)
and how grouped-query attention shares KV heads.

The model calls ``F.scaled_dot_product_attention`` and knows nothing of kernels; the
trainer enters :func:`sdpa_backend` around the forward *and* the backward of each
micro-step. The backward matters for activation checkpointing: its recomputed forward
must pick the same kernel as the original one (otherwise the saved tensors differ).

``torch.nn.attention.sdpa_kernel`` sets process-wide flags (not thread-local: the
autograd engine's device threads see them too). Under ``torch.compile`` the kernel is
chosen when the graph is traced, i.e. at the first call, which happens inside this
context; dynamo does not guard on these flags, so a compiled block keeps the kernel it
was traced with (``train bench step`` resets dynamo between points).

Grouped-query attention runs on SDPA's ``enable_gqa=True`` (``Attention.native_gqa``): the
KV heads are not copied per query head, so neither the copies nor their backward reduction
exist. Only where SDPA has no grouped-query kernel (the CPU before torch 2.10) are they
repeated (``repeat_interleave``).
"""

from __future__ import annotations

import contextlib

import torch

from train.compat import cpu_sdpa_has_gqa_kernel
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


def native_gqa_kernel(device_type: str, torch_version: str = torch.__version__) -> bool:
    """Whether SDPA has a grouped-query kernel here (CUDA kernels do; CPU from torch 2.10,
    see :func:`train.compat.cpu_sdpa_has_gqa_kernel`). Where it has none,
    K/V are repeated instead."""
    return device_type != "cpu" or cpu_sdpa_has_gqa_kernel(torch_version)


def attention_context(pcfg, device: torch.device, model) -> contextlib.AbstractContextManager:
    """Set grouped-query attention on ``model`` (SDPA's kernel where there is one; once,
    idempotent) and return the ``parallel.sdpa_backend`` context for a micro-step's forward
    and backward."""
    native = native_gqa_kernel(device.type)
    if getattr(model, "_native_gqa", None) is not native:
        for module in model.modules():
            if isinstance(getattr(module, "native_gqa", None), bool):  # attention that can share KV heads
                module.native_gqa = native
        model._native_gqa = native
    return sdpa_backend(pcfg.sdpa_backend, device)
