"""Two nodes that cannot resolve each other's host names (cloud VMs without DNS for them), and two
whose own name maps to 127.0.1.1 (Debian): a `launch torchrun` script rendered with the README's
multi-node options (`--nnodes 2 --rdzv-endpoint HOST:PORT`, HOST the first node's address) runs
unmodified on both and trains; a node that cannot reach the endpoint stops in bounded time with
one line naming what it tried."""

from __future__ import annotations

import subprocess
import time

import pytest
from cluster.harness import Cluster, kill_tree, skip_reason
from cluster.jobs import job_env, metrics, render, world_sizes

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

STEPS = 10
TRAIN = ["--config", "tiny", "--steps", str(STEPS), "--set", "train.log_every=5",
         "--set", "train.batch_size=8", "--set", "train.seq_len=64"]


@pytest.fixture(params=["own", "debian"])
def odd_cluster(request):
    if skip_reason():
        pytest.skip(skip_reason())
    with Cluster(2, hosts=request.param) as cluster:
        yield cluster


def _run_both(cluster, script, cwd, env=None, timeout=200):
    procs = [node.popen(["bash", str(script)], env=job_env(**(env or {})), cwd=str(cwd),
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for node in cluster.nodes]
    try:
        return procs, [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            kill_tree(p)


def test_two_nodes_train_whatever_their_host_names_resolve_to(odd_cluster, tmp_path):
    cluster = odd_cluster
    peer = cluster.nodes[1].run(["getent", "hosts", cluster.nodes[0].name], timeout=10)
    own = cluster.nodes[0].run(["getent", "hosts", cluster.nodes[0].name], timeout=10).stdout
    if cluster.hosts_mode == "own":
        assert peer.returncode != 0  # node1 cannot resolve node0
    else:
        assert own.startswith("127.0.1.1")
    run_dir = cluster.workdir / "run"
    script = render("torchrun", ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-endpoint",
                                 f"{cluster.nodes[0].ip}:29400", "--name", "addr", "--env", "OMP_NUM_THREADS=1"],
                    [*TRAIN, "--out", str(run_dir)], tmp_path / "train.sh")
    procs, outs = _run_both(cluster, script, tmp_path)
    for node, p, out in zip(cluster.nodes, procs, outs):
        assert p.returncode == 0, f"{node.name} ({cluster.hosts_mode}) exited {p.returncode}:\n{out[-4000:]}"
    assert world_sizes(outs[0] + outs[1]) == [4]
    assert metrics(run_dir)[-1]["step"] == STEPS


def test_a_node_that_cannot_reach_the_endpoint_stops_in_bounded_time(odd_cluster, tmp_path):
    cluster = odd_cluster
    absent = cluster.nodes[0].ip.rsplit(".", 1)[0] + ".99"  # on the bridge's subnet, no such node
    script = render("torchrun", ["--nnodes", "2", "--rdzv-endpoint", f"{absent}:29400", "--name", "lost"],
                    ["--config", "tiny"], tmp_path / "lost.sh")
    start = time.monotonic()
    proc = cluster.nodes[1].popen(["bash", str(script)], env=job_env(LAUNCH_RDZV_WAIT_S="6"), cwd=str(tmp_path),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        kill_tree(proc)
    assert proc.returncode == 2 and time.monotonic() - start < 45
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"{absent}:29400" in lines[0] and cluster.nodes[1].ip in lines[0], err
