"""Which environment variable names a job may set (``--env``, ``--env-secret``).

Below ``spec`` and ``envplan``, which both check names here: a valid identifier, each name
once, an ``NCCL_*`` name only if NCCL documents it (``nccl_documented_env.txt``), and never
a name that blog posts use but NCCL does not read (``NOT_NCCL``).
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from launch.errors import SpecError

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)

# Names copied around the internet that NCCL does not read (NCCL's env docs are the reference).
NOT_NCCL = {
    "NCCL_TIMEOUT": "NCCL has no timeout variable; use init_process_group(timeout=...) in torch",
    "NCCL_IB_ENABLE": "NCCL uses IB by default; the documented switch is NCCL_IB_DISABLE",
    "NCCL_P2P_ENABLE": "NCCL uses P2P by default; the documented switches are NCCL_P2P_DISABLE / NCCL_P2P_LEVEL",
    "NCCL_ENABLE_NVLS": "not an NCCL variable; launch leaves NVLS to NCCL's auto-detection",
    "NCCL_ASYNC_ERROR_HANDLING": "a torch setting, now TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_BLOCKING_WAIT": "a torch setting, now TORCH_NCCL_BLOCKING_WAIT",
    "NCCL_DESYNC_DEBUG": "a torch setting, now TORCH_NCCL_DESYNC_DEBUG",
}


@lru_cache(maxsize=1)
def documented_nccl() -> frozenset[str]:
    """NCCL's documented variables (``launch/nccl_documented_env.txt``)."""
    text = (Path(__file__).resolve().parent / "nccl_documented_env.txt").read_text(encoding="utf-8")
    return frozenset(ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#"))


def check_env_name(option: str, name: str, allow_undocumented_nccl: bool = False) -> str:
    """A valid identifier; an ``NCCL_*`` name must be one NCCL documents (NCCL ignores a
    misspelt name silently) unless explicitly allowed."""
    if not _ENV_NAME.fullmatch(name) or len(name) > 255:
        raise SpecError(f"{option} {name!r}: {name!r} is not a valid environment variable name")
    if name in NOT_NCCL:
        raise SpecError(f"{name} is not an NCCL variable: {NOT_NCCL[name]}")
    if name.startswith("NCCL_") and name not in documented_nccl() and not allow_undocumented_nccl:
        raise SpecError(
            f"{option} {name}: not a documented NCCL variable (see launch/nccl_documented_env.txt); "
            "pass --allow-undocumented-nccl to set it anyway"
        )
    return name


def check_unique_env(names) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise SpecError(f"environment variable {name} is given twice (--env / --env-secret)")
        seen.add(name)
