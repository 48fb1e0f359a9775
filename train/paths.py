"""Where ``train`` keeps files between runs (a leaf module: no imports from ``train``)."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/hopper-train`` (``~/.cache/hopper-train``): the embedded corpus,
    tokenised data, Inductor's compiled kernels."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hopper-train"
