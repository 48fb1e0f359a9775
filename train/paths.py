"""Where ``train`` keeps files between runs (a leaf module: no imports from ``train``; ``core.homepath`` only)."""

from __future__ import annotations

import os
from pathlib import Path

# Environment variables naming a directory on this machine that train (or torch, for the
# Inductor/Triton caches) writes: a leading '~' in them is expanded once, at start.
PATH_ENV = ("XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def expand_path_env() -> None:
    """Expand a leading ``~``/``~user`` in :data:`PATH_ENV` in this process's environment (what torch
    reads too), as a shell does in ``X=~/c`` but not in ``env X=~/c``, a unit file or a manifest.
    A ``~user`` naming no user is an InputError naming the variable."""
    from core.homepath import expand_home

    for name in PATH_ENV:
        value = os.environ.get(name, "")
        if value.startswith("~"):
            os.environ[name] = expand_home(value, f"environment {name}")


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
