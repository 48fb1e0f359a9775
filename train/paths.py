"""Where ``train`` keeps files between runs (a leaf module: no imports from ``train``)."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/hopper-train`` (``~/.cache/hopper-train``): the embedded corpus,
    tokenised data, Inductor's compiled kernels."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # unset, empty or relative: the XDG spec says to ignore it
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hopper-train"


def default_cache_origin() -> str:
    """The environment variable that chose ``default_cache_dir()`` (what a message names)."""
    return "XDG_CACHE_HOME" if os.path.isabs(os.environ.get("XDG_CACHE_HOME", "")) else "HOME"
