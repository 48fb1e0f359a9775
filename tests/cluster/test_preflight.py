"""`launch torchrun --preflight` on the emulated cluster: a throttled node stops the job before
training, named; healthy nodes pass into training (gloo, CPU, the rendered script unmodified).

The link of the throttled node is shaped with tc (tbf) to 100 Mbit/s = 0.0125 GB/s; the
expected busbw is given as 0.1 GB/s (--preflight-busbw; gloo over veths on this 2-core CPU
moves ~0.5 GB/s), so the threshold (x 0.5) is 0.05 GB/s: 4x above the throttled node and
10x below a healthy one.
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest
from cluster.harness import kill_tree
from cluster.jobs import job_env, metrics, render

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

TRAIN = ["--config", "tiny", "--steps", "5", "--set", "train.batch_size=4", "--set", "train.seq_len=64",
         "--set", "metrics.progress=false"]


def _render(cluster, tmp_path, run_dir, nodes: int):
    return render("torchrun", ["--nnodes", str(nodes), "--nproc-per-node", "1", "--rdzv-endpoint", "node0:29400",
                               "--fabric", "ethernet", "--name", "pf", "--env", "OMP_NUM_THREADS=1",
                               "--preflight", "--preflight-busbw", "0.1"],
                  [*TRAIN, "--out", str(run_dir)], tmp_path / "job.sh")


def _run_everywhere(cluster, script, tmp_path, timeout=200):
    t0 = time.monotonic()
    procs = [node.popen(["bash", str(script)], env=job_env(), cwd=str(tmp_path),
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for node in cluster.nodes]
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            kill_tree(p)
    return [p.returncode for p in procs], outs, time.monotonic() - t0


def _verdict(out: str) -> str:
    lines = [line for line in out.splitlines() if "preflight: " in line and ("FAIL" in line or "PASS" in line)]
    return lines[-1] if lines else ""


def test_preflight_names_the_throttled_node_and_stops_before_training(cluster, tmp_path):
    run_dir = cluster.workdir / "run_slow"
    script = _render(cluster, tmp_path, run_dir, 2)
    cluster.shape(cluster.node("node1"), rate="100mbit", both=False)  # node1's egress only
    codes, outs, _ = _run_everywhere(cluster, script, tmp_path)
    verdict = _verdict(outs[0])
    assert codes == [3, 3], (codes, outs[0][-3000:], outs[1][-2000:])
    assert "preflight: FAIL (slow node: node1)" in verdict, outs[0][-3000:]
    assert "node1 sends to node0 at 0.01" in verdict, verdict
    assert "launch: preflight failed (see above): not starting training" in outs[0] + outs[1]
    assert not metrics(run_dir) and not (run_dir / "checkpoints").exists(), "training started"


def test_preflight_names_the_slow_one_of_three_nodes(cluster3, tmp_path):
    run_dir = cluster3.workdir / "run_slow3"
    script = _render(cluster3, tmp_path, run_dir, 3)
    cluster3.shape(cluster3.node("node2"), rate="100mbit")  # both directions of node2's link
    codes, outs, _ = _run_everywhere(cluster3, script, tmp_path)
    verdict = _verdict(outs[0])
    assert codes == [3, 3, 3], (codes, outs[0][-3000:])
    assert "preflight: FAIL (slow node: node2)" in verdict, outs[0][-3000:]
    assert "node0" not in verdict.split("):")[0] and "node1" not in verdict.split("):")[0], verdict
    assert not metrics(run_dir), "training started"


def test_healthy_nodes_pass_into_training_and_the_cost_is_reported(cluster, tmp_path, capsys):
    run_dir = cluster.workdir / "run_ok"
    script = _render(cluster, tmp_path, run_dir, 2)
    codes, outs, wall = _run_everywhere(cluster, script, tmp_path)
    assert codes == [0, 0], (codes, outs[0][-3000:], outs[1][-2000:])
    verdict = _verdict(outs[0])
    assert verdict.startswith("preflight: PASS: 2 node(s)"), outs[0][-3000:]
    assert [r["step"] for r in metrics(run_dir)][-1] == 5
    took = re.search(r"preflight took ([0-9.]+) s", outs[0])
    whole = re.search(r"launch: preflight passed in ([0-9]+) s", outs[0])
    assert took and whole, outs[0][-2000:]
    with capsys.disabled():
        print(f"\n[preflight cost] {whole.group(1)} s for the preflight torchrun (start, rendezvous, check; "
              f"the check itself {took.group(1)} s); whole job with 5 training steps {wall:.1f} s")


def test_slurm_job_with_preflight_stops_before_training_naming_the_node(cluster, tmp_path):
    """The rendered `launch slurm --preflight` script under the real Slurm of the harness: srun runs
    the check on both nodes first; node1 throttled -> the job fails with exit code 3, log names it."""
    import sys
    from pathlib import Path

    import yaml
    from cluster.jobs import REPO
    from cluster.slurm import Slurm, slurm_missing

    if slurm_missing():
        pytest.skip(slurm_missing())
    profile = yaml.safe_load((REPO / "core" / "profiles" / "generic.yaml").read_text())
    profile.update(description="emulated cluster node: 2 CPU cores, 1 training process", cpus_per_node=2)
    profile["gpu"]["gpus_per_node"] = 1
    (cluster.workdir / "node.yaml").write_text(yaml.safe_dump(profile))
    run_dir = cluster.workdir / "run_slurm"
    script = render("slurm", ["--profile", str(cluster.workdir / "node.yaml"), "--nnodes", "2", "--name", "pfs",
                              "--fabric", "ethernet", "--gpu-gres", "none", "--venv", str(Path(sys.executable).parents[1]),
                              "--env", "OMP_NUM_THREADS=1", "--preflight", "--preflight-busbw", "0.1"],
                    [*TRAIN, "--out", str(run_dir)], cluster.workdir / "pfs.sbatch")
    cluster.shape(cluster.node("node1"), rate="100mbit", both=False)
    slurm = Slurm(cluster)
    try:
        jobid = slurm.sbatch(script, env=job_env(), cwd=str(cluster.workdir))
        info = slurm.wait_state(jobid, {"FAILED", "COMPLETED"}, timeout=200, fail_states=())
        log = (cluster.workdir / f"pfs-{jobid}.out").read_text(errors="replace")
    finally:
        slurm.stop()
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "3:0", (info, log[-3000:])
    assert "preflight: FAIL (slow node: node1)" in log, log[-3000:]
    assert "launch: preflight failed (see above): not starting training" in log
    assert not metrics(run_dir), "training started"
