"""Fixtures for the emulated-cluster tests (``make test-cluster``; harness API: harness.py).

Tests under tests/cluster carry the ``cluster`` marker and run only when selected with
``-m cluster`` (``make test-cluster``); a plain ``pytest`` / ``make test`` deselects them.
"""

from __future__ import annotations

import pytest
from cluster.harness import Cluster, cleanup_leftovers, skip_reason


def pytest_collection_modifyitems(config, items):
    markexpr = config.getoption("markexpr", "") or ""
    if "cluster" in markexpr:
        return
    keep, drop = [], []
    for item in items:
        (drop if "cluster" in item.keywords else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _make(n: int):
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    cleanup_leftovers()
    cluster = Cluster(n)
    try:
        yield cluster
    finally:
        cluster.teardown()


@pytest.fixture
def cluster():
    """Two nodes, node0 and node1."""
    yield from _make(2)


@pytest.fixture
def cluster3():
    """Three nodes, node0..node2."""
    yield from _make(3)


@pytest.fixture(scope="module")
def slurm():
    """A 2-node cluster running real Slurm (munged, slurmctld, slurmd per node); see slurm.py."""
    from cluster.slurm import Slurm, slurm_missing

    reason = skip_reason() or slurm_missing()
    if reason:
        pytest.skip(reason)
    cleanup_leftovers()
    cluster = Cluster(2)
    try:
        daemons = Slurm(cluster)
        try:
            yield daemons
        finally:
            daemons.stop()
    finally:
        cluster.teardown()
