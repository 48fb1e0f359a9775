"""Shared test fixtures. GPU tests carry ``@pytest.mark.gpu`` and skip without CUDA.

Shared helpers (not fixtures) live in tests/testlib.py, importable as ``testlib`` from every
test directory because this file puts tests/ on sys.path; the launch tests' own helpers are
in tests/launch/launch_testlib.py. No test module imports another."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        ngpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        ngpu = 0
    for item in items:
        if "gpu" in item.keywords and ngpu == 0:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (none visible)"))
        if "multigpu" in item.keywords and ngpu < 2:
            item.add_marker(pytest.mark.skip(reason=f"needs >= 2 CUDA GPUs ({ngpu} visible)"))


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """One embedded-corpus cache for the whole session, not the user's ~/.cache. What code run
    in this process writes into its environment does not outlive the test (Inductor writes its
    /tmp default into TORCHINDUCTOR_CACHE_DIR when first asked): a variable read at import time
    (tests/zygote.py's FRESH_PREFIXES) that stayed changed would make every later train run of
    this process a new interpreter instead of a fork of the zygote."""
    from zygote import FRESH_PREFIXES

    cache = tmp_path_factory.getbasetemp() / "xdg-cache"
    cache.mkdir(exist_ok=True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    before = {k: v for k, v in os.environ.items() if k.startswith(FRESH_PREFIXES)}
    yield
    for key in [k for k in os.environ if k.startswith(FRESH_PREFIXES) and k not in before]:
        del os.environ[key]
    os.environ.update(before)


@pytest.fixture(params=["sync", "async"])
def checkpoint_mode(request) -> list[str]:
    """``train run`` arguments for synchronous DCP saves or ``checkpoint.async_save``: crash and
    resume tests take this fixture so both modes pass the same assertions."""
    return ["--set", f"checkpoint.async_save={str(request.param == 'async').lower()}"]


def pytest_sessionfinish(session, exitstatus):
    import testlib

    if testlib._ZYGOTE is not None:
        testlib._ZYGOTE.close()
