"""Hardware profiles for ``train doctor --profile``: read through ``core.catalog`` (its
search path honours ``LAUNCH_PROFILE_PATH``), GPU facts from ``train.hardware``."""

from __future__ import annotations

import re

from core.catalog import available
from core.catalog import load_profile as load_catalog_profile
from core.errors import InputError
from core.safety import excerpt
from train.hardware import fp8_kinds, mxfp8_backends


def load_profile(name: str) -> dict:
    """``{"name", "model", "arch", "gpus_per_node", "memory_gb", "fp8", "nvlink", "cpu_arch", "fp8_by_arch",
    "mxfp8_backends"}`` of a hardware profile; raises ``KeyError`` naming the valid profiles
    when ``name`` is unknown, or the file's problem when it cannot be read."""
    files = available("profiles")
    if not name.strip():
        raise KeyError(f"--profile is empty (valid: {', '.join(files) or 'none found'})")
    if name not in files:
        raise KeyError(f"--profile {excerpt(name)}: unknown profile (valid: {', '.join(files) or 'none found'})")
    try:
        prof = load_catalog_profile(name)
    except InputError as exc:
        raise KeyError(f"--profile {excerpt(name)}: {exc}") from None
    cap = capability(prof.arch)
    return {
        "name": name,
        "model": prof.gpu_model,
        "arch": prof.arch,
        "gpus_per_node": prof.gpus_per_node,
        "memory_gb": prof.memory_gb,
        "fp8": list(prof.fp8),
        "nvlink": bool(prof.nvlink),
        "cpu_arch": prof.cpu_arch,
        "fp8_by_arch": list(fp8_kinds(cap)) if cap else None,
        "mxfp8_backends": list(mxfp8_backends(cap)) if cap else None,
    }


def capability(arch: str) -> tuple[int, int] | None:
    """``sm_90`` -> (9, 0), ``sm_100`` -> (10, 0), ``sm_120`` -> (12, 0); None otherwise."""
    m = re.fullmatch(r"sm_(\d+)(\d)a?", arch.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None
