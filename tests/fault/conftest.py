"""Fixtures of the fault tests: one finished small run per session, copied fresh for each test."""

from __future__ import annotations

import shutil

import pytest

from testlib import finished_run


@pytest.fixture(scope="session")
def _finished_run(tmp_path_factory):
    return finished_run(tmp_path_factory.mktemp("base") / "run")


@pytest.fixture
def run_copy(_finished_run, tmp_path):
    """A finished 2-step run of testlib.QUIET_RUN (checkpoint step_00000002), a fresh copy for every test."""
    shutil.copytree(_finished_run, tmp_path / "run", symlinks=True)
    return tmp_path / "run"


@pytest.fixture(autouse=True)
def _registry(monkeypatch):
    """The launch cases render for a registry (as after `make push REGISTRY=...`), so that each case
    meets the check it is about rather than the short-image-name rule of the cluster backends."""
    monkeypatch.setenv("REGISTRY", "registry.example.invalid/ml")
