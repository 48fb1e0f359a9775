"""`launch torchrun --nnodes 2` rendered once and run, unmodified, on node0 and node1 (gloo, CPU)."""

from __future__ import annotations

import subprocess

import pytest
from cluster.harness import kill_tree
from cluster.jobs import job_env, load_checkpoint_check, metrics, render, world_sizes

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

STEPS = 30
TRAIN = ["--config", "tiny", "--steps", str(STEPS), "--set", "train.log_every=5",
         "--set", "train.batch_size=8", "--set", "train.seq_len=64"]


def test_two_node_torchrun_trains_to_completion(cluster, tmp_path):
    run_dir = cluster.workdir / "run"
    script = render("torchrun", ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-endpoint", "node0:29400",
                                 "--name", "two-node", "--env", "OMP_NUM_THREADS=1"],
                    [*TRAIN, "--out", str(run_dir)], tmp_path / "train.sh")
    procs = [node.popen(["bash", str(script)], env=job_env(), cwd=str(tmp_path),
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for node in cluster.nodes]
    try:
        outs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            kill_tree(p)
    for node, p, out in zip(cluster.nodes, procs, outs):
        assert p.returncode == 0, f"{node.name} exited {p.returncode}:\n{out[-4000:]}"
    log = outs[0] + outs[1]
    assert world_sizes(log) == [4], log[-3000:]  # 2 nodes x 2 processes, one model line from rank 0
    rows = metrics(run_dir)
    assert [r["step"] for r in rows][-1] == STEPS
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.3, [r["loss"] for r in rows]
    load_checkpoint_check(run_dir, STEPS, TRAIN[2:])
