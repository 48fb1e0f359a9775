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


# The files that take longest (seconds of a 2-worker `make test`, --durations, 2026-11-28),
# longest first. They are collected first, so pytest-xdist's --dist loadfile hands them out
# before the short files, and both workers end at about the same time.
SLOW_FILES = (
    "tests/test_docs_commands.py", "tests/fault/test_fault_process.py", "tests/train/test_train_run.py",
    "tests/train/test_prepare.py", "tests/train/test_spawn.py", "tests/launch/test_k8s_runtime_contract.py",
    "tests/parallel/test_parallel_compile.py", "tests/fault/test_fault_checkpoint.py",
    "tests/parallel/test_model_families.py", "tests/launch/test_launch_shell.py", "tests/train/test_plan.py",
    "tests/fault/test_fault_resume_state.py", "tests/parallel/test_parallel_equivalence.py",
    "tests/fault/test_fault_rundir.py", "tests/comm/test_comm_bench.py", "tests/fault/test_fault_numerics.py",
    "tests/parallel/test_parallel_bench.py",
)


def _slow_rank(item) -> int:
    try:
        path = item.path.resolve().relative_to(ROOT).as_posix()
    except ValueError:  # outside the repository
        return len(SLOW_FILES)
    return SLOW_FILES.index(path) if path in SLOW_FILES else len(SLOW_FILES)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_slow_rank)  # stable: the order within each file, and of the other files, stays
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
