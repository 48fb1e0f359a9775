"""``torch.compile`` per transformer block (``parallel.compile``, ``parallel.compile_mode``,
``parallel.activation_memory_budget``).

Blocks are compiled in place with ``nn.Module.compile`` (no ``_orig_mod.`` wrapper, so
parameter names do not change). All blocks share one code object and, with torch's
default of inlining built-in nn modules, one compiled graph: compile time does not grow
with depth.

Inductor's on-disk caches live under ``TORCHINDUCTOR_CACHE_DIR``; when unset it defaults
to ``~/.cache/hopper-train/inductor`` (``$XDG_CACHE_HOME`` honoured) rather than a /tmp
directory, so that a second launch of the same model reuses the compiled kernels.
"""

from __future__ import annotations

import os
from pathlib import Path

from torch import nn

from train.paths import default_cache_dir


def _torch_default_cache_dir() -> str | None:
    """Inductor's own default (``/tmp/torchinductor_$USER``). Inductor writes it into
    ``TORCHINDUCTOR_CACHE_DIR`` the first time anything asks for its cache directory, so
    that value in the environment does not mean the user chose it."""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # private module moved: only an unset variable counts as unset
        return None
    return os.path.abspath(default_cache_dir())


def inductor_cache_dir() -> Path:
    """Set ``TORCHINDUCTOR_CACHE_DIR`` if the user has not, and return it."""
    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not current or os.path.abspath(current) == _torch_default_cache_dir():
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(default_cache_dir() / "inductor")
    path = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    path.mkdir(parents=True, exist_ok=True)
    return path


def apply_compile(model: nn.Module, pcfg) -> int:
    """Compile every block of ``model.layers`` in place; returns how many."""
    if not pcfg.compile:
        return 0
    inductor_cache_dir()
    # process-wide: set on every compile, so that one job's budget does not outlive it
    import torch._functorch.config as functorch_config

    functorch_config.activation_memory_budget = pcfg.activation_memory_budget
    kwargs = {"backend": pcfg.compile_backend, "fullgraph": True}
    if pcfg.compile_backend == "inductor" and pcfg.compile_mode != "default":
        kwargs["mode"] = pcfg.compile_mode
    for block in model.layers.values():
        block.compile(**kwargs)
    return len(model.layers)
