"""Elastic `launch torchrun --nnodes 1:3`, rendered once and run unmodified on each node: a node
crashes (SIGKILL of every process on it) and the survivor re-rendezvouses and resumes from the
last checkpoint; a third node that starts mid-run is admitted at the next restart round."""

from __future__ import annotations

import signal
import subprocess
import threading

import pytest
from cluster.harness import kill_tree
from cluster.jobs import checkpoints, job_env, load_checkpoint_check, metrics, render, wait_for, world_sizes

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(480)]

STEPS = 60
TRAIN = ["--config", "tiny", "--steps", str(STEPS), "--checkpoint-every", "4", "--set", "train.log_every=1",
         "--set", "train.batch_size=8", "--set", "train.seq_len=64"]


class Tee:
    """A node's launcher with its output collected in the background."""

    def __init__(self, node, script, cwd):
        self.node = node
        self.proc = node.popen(["bash", str(script)], env=job_env(), cwd=str(cwd), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def text(self) -> str:
        return "".join(self.lines)


def test_elastic_kill_one_node_then_admit_a_third(cluster3, tmp_path):
    n0, n1, n2 = cluster3.nodes
    run_dir = cluster3.workdir / "run"
    script = render("torchrun", ["--nnodes", "1:3", "--nproc-per-node", "1", "--rdzv-endpoint", "node0:29400",
                                 "--name", "elastic", "--env", "OMP_NUM_THREADS=1"],
                    [*TRAIN, "--out", str(run_dir), "--resume"], tmp_path / "elastic.sh")
    assert "--nnodes 1:3" in script.read_text() and "--max-restarts 3" in script.read_text()
    nodes = {n0.name: Tee(n0, script, tmp_path), n1.name: Tee(n1, script, tmp_path)}
    try:
        wait_for(lambda: 2 in world_sizes(nodes["node0"].text + nodes["node1"].text), 180, "2-node world",
                 [t.proc for t in nodes.values()])
        wait_for(lambda: checkpoints(run_dir) and metrics(run_dir)[-1]["step"] >= 6, 180, "a checkpoint",
                 [t.proc for t in nodes.values()])
        killed_at = metrics(run_dir)[-1]["step"]
        n1.kill_all(signal.SIGKILL)  # node1 crashes: torchrun, workers, everything on it
        assert nodes["node1"].proc.wait(timeout=30) == -signal.SIGKILL
        survivors = lambda: nodes["node0"].text  # noqa: E731
        wait_for(lambda: "resumed from" in survivors() and world_sizes(survivors())[-1:] == [1], 240,
                 "node0 alone, resumed", [nodes["node0"].proc])
        nodes[n2.name] = Tee(n2, script, tmp_path)  # a third node joins mid-run
        for name in ("node0", "node2"):
            assert nodes[name].proc.wait(timeout=300) == 0, nodes[name].text[-4000:]
    finally:
        for tee in nodes.values():
            kill_tree(tee.proc)
            tee.proc.wait(timeout=30)
            tee.thread.join(timeout=10)
    log = nodes["node0"].text + nodes["node2"].text
    sizes = world_sizes(nodes["node1"].text + nodes["node0"].text)
    assert sizes[0] == 2 and 1 in sizes and sizes[-1] == 2, sizes  # 2 nodes -> survivor alone -> 2 again
    resumed = [int(s) for s in __import__("re").findall(r"resumed from \S+ at step (\d+)", log)]
    assert resumed and 0 < resumed[0] <= killed_at and resumed == sorted(resumed), (resumed, killed_at)
    rows = metrics(run_dir)
    assert rows[-1]["step"] == STEPS and rows[-1]["loss"] < rows[0]["loss"]
    assert checkpoints(run_dir)[-1] == STEPS
    load_checkpoint_check(run_dir, STEPS, TRAIN[2:])
