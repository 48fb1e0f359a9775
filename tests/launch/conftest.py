"""The launch tests render for a registry, as a user who ran `make push REGISTRY=...` does: the
environment's REGISTRY (the one `make` reads) names the default image's registry, so that the
cluster backends' renders need no --image (tests of the short-name rule clear it)."""

from __future__ import annotations

import pytest

TEST_REGISTRY = "registry.example.invalid/ml"


@pytest.fixture(autouse=True)
def _registry(monkeypatch):
    # the test's own monkeypatch: one undo stack, so a test that clears or changes REGISTRY
    # leaves the environment as it found it whatever the order of the fixtures' teardowns
    monkeypatch.setenv("REGISTRY", TEST_REGISTRY)
