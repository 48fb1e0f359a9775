"""GPU facts used by metrics and the setup checker, and this host's memory.

Peak dense BF16 tensor-core rates per GPU, from NVIDIA's datasheets (the datasheets
quote "with sparsity" figures; dense is half of those):
  H100 SXM 1,979 sparse -> 989 dense; H100 PCIe 1,513 -> 756; H100 NVL 1,671 -> 835;
  H200 SXM 1,979 -> 989; H200 NVL 1,671 -> 835; HGX B200 4.5 PF -> 2,250 per GPU;
  GB200 NVL72 5 PF -> 2,500 per GPU; A100 312 dense.
Unknown GPUs (and the RTX Pro 6000, whose datasheet we did not verify) report no MFU
unless ``metrics.peak_tflops`` is given. Order matters: the first match wins.
"""

from __future__ import annotations

import os

PEAK_BF16_TFLOPS: list[tuple[str, float]] = [
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),
    ("H200 NVL", 835.0),
    ("H200", 989.0),
    ("GB200", 2500.0),
    ("B200", 2250.0),
    ("A100", 312.0),
]

# compute capability -> FP8 kinds that run natively (tensor cores)
FP8_BY_CAPABILITY: dict[tuple[int, int], tuple[str, ...]] = {
    (8, 9): ("e4m3/e5m2",),  # Ada (L4, L40S)
    (9, 0): ("e4m3/e5m2",),  # Hopper H100/H200
    (10, 0): ("e4m3/e5m2", "mxfp8"),  # Blackwell B200/GB200
    (12, 0): ("e4m3/e5m2",),  # RTX Pro 6000 Blackwell (no TE MXFP8 there)
}


def peak_bf16_tflops(device_name: str) -> float | None:
    for key, value in PEAK_BF16_TFLOPS:
        if key.lower() in device_name.lower():
            return value
    return None


# compute capability -> architecture / product name (for messages)
ARCH_NAMES: dict[tuple[int, int], str] = {
    (8, 0): "A100", (8, 6): "Ampere", (8, 9): "Ada", (9, 0): "Hopper", (10, 0): "Blackwell B200/GB200",
    (12, 0): "RTX Pro 6000 Blackwell",
}


def sm_name(capability: tuple[int, int]) -> str:
    """``sm_90 (Hopper)``: the compute capability as an SM name, with the architecture when known."""
    name = ARCH_NAMES.get(capability)
    return f"sm_{capability[0]}{capability[1]}" + (f" ({name})" if name else "")


def fp8_kinds(capability: tuple[int, int]) -> tuple[str, ...]:
    if capability in FP8_BY_CAPABILITY:
        return FP8_BY_CAPABILITY[capability]
    return ("e4m3/e5m2",) if capability >= (8, 9) else ()


# compute capability -> FP8 training backends with an MXFP8 (1x32 blocks, e8m0 scales) recipe.
# Transformer Engine's MXFP8 recipe targets sm_100 only; torchao's MX path gates on
# sm >= 10.0, which admits sm_120 (RTX Pro 6000) too (not measured here).
MXFP8_BACKENDS_BY_CAPABILITY: dict[tuple[int, int], tuple[str, ...]] = {
    (10, 0): ("torchao", "te"),  # B200 / GB200
    (12, 0): ("torchao",),  # RTX Pro 6000 Blackwell: no TE MXFP8
}


def mxfp8_backends(capability: tuple[int, int]) -> tuple[str, ...]:
    return MXFP8_BACKENDS_BY_CAPABILITY.get(capability, ())


def host_memory_bytes() -> int:
    """This host's physical memory (0 where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0

