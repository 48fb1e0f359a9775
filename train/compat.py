"""Where the torch versions the project supports differ in something it relies on: one place.

A leaf (imports nothing): each function takes ``torch.__version__`` as a string, so the
doctor's memory model can ask about the installed torch and tests about any other.
Measured versions are named; an unparseable version counts as new.
"""

from __future__ import annotations


def _at_least(torch_version: str, minimum: tuple[int, int]) -> bool:
    parts = torch_version.split("+")[0].split(".")
    try:
        return (int(parts[0]), int(parts[1])) >= minimum
    except (IndexError, ValueError):
        return True


def rms_norm_fp32_in_autocast(torch_version: str) -> bool:
    """torch 2.12 put ``rms_norm`` on CUDA autocast's fp32 list: with bf16 inputs (FSDP2
    bf16 params) it then saves an fp32 copy and each linear casts the fp32 output back."""
    return _at_least(torch_version, (2, 12))


def cpu_sdpa_has_gqa_kernel(torch_version: str) -> bool:
    """torch 2.7's CPU SDPA has no grouped-query kernel: ``enable_gqa=True`` falls back to the
    math backend, which materialises the s x s scores (measured: torch 2.7.1 CPU; 2.10.0 and
    2.13.0 CPU keep K/V unrepeated in the flash kernel)."""
    return _at_least(torch_version, (2, 10))


def mm_fp32_out(torch_version: str) -> bool:
    """bf16/fp16 matmuls that write fp32 on CUDA (``torch.mm``/``torch.addmm`` with
    ``out_dtype``; ``aten::addmm.dtype_out``): torch 2.10.0 has them, 2.7.1 does not (checked
    in the torch-range venvs). The chunked loss accumulates the output weight's gradient with
    them (train/loss.py)."""
    return _at_least(torch_version, (2, 10))
