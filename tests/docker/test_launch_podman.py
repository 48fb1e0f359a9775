"""The rendered `launch docker` script, unmodified, run for real by podman against the
project image.

Needs root, podman and the image that scripts/container_test.sh builds; that script runs
this file in CI's container step with LAUNCH_PODMAN_IMAGE set (and CONTAINERS_CONF /
CONTAINERS_STORAGE_CONF pointing podman at its storage). Elsewhere it is skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("LAUNCH_PODMAN_IMAGE", "")

pytestmark = [
    pytest.mark.container,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not IMAGE, reason="LAUNCH_PODMAN_IMAGE not set (scripts/container_test.sh sets it)"),
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (rootful podman, as in CI)"),
]

TINY = ["--config", "tiny", "--set", "train.log_every=1"]
# Seconds of a tiny step at batch 16 in this container, measured by the first test; the
# stop test sizes its batch so that shutting down takes well over docker's/podman's 10 s.
MEASURED: dict[str, float] = {}


def render(tmp: Path, *argv: str) -> Path:
    """`launch docker ...` through the real CLI, written with -o (as a user would)."""
    script = tmp / "job.sh"
    proc = subprocess.run(
        [sys.executable, "-m", "launch", "docker", "--image", IMAGE, "-o", str(script), *argv],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    return script


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)


def script_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAUNCH_")}
    env.update(extra)
    return env


@pytest.fixture
def container_name(request):
    import re

    name = "ht-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:40].strip("-")
    podman("rm", "-f", "-t", "0", name)
    yield name
    podman("rm", "-f", "-t", "0", name)  # also after a failure: nothing left running


def metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def steps_of(run_dir: Path) -> list[int]:
    ckpts = run_dir / "checkpoints"
    return sorted(int(p.name.split("_")[1]) for p in ckpts.glob("step_*")) if ckpts.is_dir() else []


def test_two_cpu_processes_train_to_completion_fresh_host_dir(tmp_path, container_name):
    """Engine detected (no LAUNCH_ENGINE), fresh nested host directory with a blank in its
    path created and handed to the image's user, --out defaulting under the volume."""
    ckpt = tmp_path / "fresh host" / "ckpt"
    script = render(tmp_path, "--cpu", "--nproc-per-node", "2", "--name", container_name,
                    "--checkpoint-dir", str(ckpt), "--grace-period", "60",
                    "--", *TINY, "--steps", "10", "--checkpoint-every", "10")
    proc = subprocess.run(["bash", str(script)], env=script_env(), capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"podman run --name {container_name}" in proc.stderr
    assert f"created {ckpt} owned by 1000:1000" in proc.stderr
    st = ckpt.stat()
    assert (st.st_uid, st.st_gid) == (1000, 1000)
    run_dir = ckpt / container_name  # --out <checkpoint-dir>/<job name>
    rows = [r for r in metrics(run_dir) if "loss" in r]
    assert rows and rows[-1]["step"] == 10
    times = sorted(r["step_time_s"] for r in rows[1:])
    MEASURED["step16_s"] = times[len(times) // 2]
    assert rows[0].get("world_size", 2) == 2
    assert steps_of(run_dir) == [10]
    assert podman("container", "exists", container_name).returncode == 1, "--rm left the container behind"


def test_podman_stop_by_name_keeps_preemption_checkpoint_then_resume(tmp_path, container_name):
    """`podman stop NAME` with its default timeout: the container's stop timeout is the
    grace period, the training loop checkpoints and exits before SIGKILL; the same script
    with --resume continues from that checkpoint."""
    ckpt = tmp_path / "ckpt"
    grace = 120
    # A step of ~25 s: SIGTERM right after a step is logged means the loop needs the rest
    # of the next step plus the save (> 10 s) before it can exit.
    batch = int(min(max(16 * 25 / MEASURED.get("step16_s", 0.5), 32), 4096)) // 16 * 16
    script = render(tmp_path, "--cpu", "--nproc-per-node", "2", "--name", container_name,
                    "--checkpoint-dir", str(ckpt), "--grace-period", str(grace),
                    "--", *TINY, "--set", f"train.batch_size={batch}", "--steps", "100000",
                    "--checkpoint-every", "100000")
    env = script_env(LAUNCH_ENGINE="podman", LAUNCH_ENGINE_FLAGS="--label=io.hopper-train.test=stop")
    log = (tmp_path / "run.log").open("w")
    job = subprocess.Popen(["bash", str(script)], env=env, stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True)
    run_dir = ckpt / container_name
    try:
        deadline = time.monotonic() + 300
        while not [r for r in metrics(run_dir) if "loss" in r]:  # stop right after step 1
            assert job.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no training step within 300 s"
            time.sleep(1)
        inspect = podman("inspect", "--format", "{{.Config.StopTimeout}} {{index .Config.Labels \"io.hopper-train.test\"}}",
                         container_name)
        assert inspect.stdout.split() == [str(grace), "stop"], inspect.stdout + inspect.stderr
        t0 = time.monotonic()
        stop = podman("stop", container_name, timeout=grace + 60)  # default timeout: the container's
        stop_s = time.monotonic() - t0
        assert stop.returncode == 0, stop.stderr
        job.wait(timeout=60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, 9)
            job.wait()
        log.close()
    text = (tmp_path / "run.log").read_text()
    assert "preempted: checkpoint written" in text, text[-3000:]
    assert stop_s < grace, f"podman stop took {stop_s:.0f}s: the container was SIGKILLed"
    # > 10 s: without --stop-timeout the engine would have SIGKILLed it (how long depends on
    # the machine's load; test_stop_waits_for_a_slow_shutdown proves it deterministically)
    saved = steps_of(run_dir)
    assert len(saved) == 1, saved
    step = saved[0]

    proc = subprocess.run(["bash", str(script), "--resume", "--steps", str(step + 1)], env=script_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [r for r in metrics(run_dir) if "loss" in r]
    assert rows[-1]["step"] == step + 1
    print(f"podman stop took {stop_s:.1f}s (grace {grace}s, batch {batch}); preemption checkpoint at step {step}; "
          f"resumed to {step + 1}")


_SLOW_EXIT = """
import pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
def term(*_):
    time.sleep(15)  # a preemption checkpoint that takes longer than docker's/podman's 10 s
    (out / "shutdown-finished").write_text("ok")
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
(out / "started").write_text("ok")
while True:
    time.sleep(0.2)
"""


@pytest.mark.parametrize("engine_flags", ["", "--stop-timeout=10"], ids=["rendered", "engine-default-10s"])
def test_stop_waits_for_a_slow_shutdown(tmp_path, container_name, engine_flags):
    """`podman stop NAME` (default timeout) on the rendered script whose program needs 15 s
    after SIGTERM: the container's stop timeout (--grace-period 60) lets it finish; the
    control, the engine's default 10 s put back through LAUNCH_ENGINE_FLAGS, kills it."""
    prog = tmp_path / "prog"
    prog.mkdir()
    (prog / "slow_exit.py").write_text(_SLOW_EXIT)
    ckpt = tmp_path / "ckpt"
    script = render(tmp_path, "--cpu", "--nproc-per-node", "1", "--name", container_name, "--grace-period", "60",
                    "--checkpoint-dir", str(ckpt), "--mount", f"{prog}:/prog:ro",
                    "--entrypoint", "python /prog/slow_exit.py", "--", str(ckpt))
    job = subprocess.Popen(["bash", str(script)], env=script_env(LAUNCH_ENGINE_FLAGS=engine_flags),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not (ckpt / "started").exists():
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()[0][-3000:]
            time.sleep(0.5)
        t0 = time.monotonic()
        stop = podman("stop", container_name, timeout=120)
        stop_s = time.monotonic() - t0
        out = job.communicate(timeout=60)[0]
    finally:
        if job.poll() is None:
            os.killpg(job.pid, 9)
            job.wait()
    assert stop.returncode == 0, stop.stderr
    if engine_flags:
        assert not (ckpt / "shutdown-finished").exists(), "the 10 s default should have SIGKILLed it"
        assert 9 < stop_s < 14, stop_s
        print(f"control: podman stop SIGKILLed after {stop_s:.1f}s, shutdown lost")
        return
    assert (ckpt / "shutdown-finished").read_text() == "ok", out[-3000:]
    assert 14 < stop_s < 60, stop_s
    print(f"podman stop waited {stop_s:.1f}s for a 15 s shutdown (stop timeout 60 s)")


# Each node of the emulated cluster (tests/cluster/harness.py) runs podman in its own
# network namespace and hostname; `ip netns exec` gives it a fresh /sys without the cgroup
# mounts podman needs, so they are mounted again (the host's v1 hierarchies, or cgroup2).
_CGROUPS_AGAIN = r'''set -e
if grep -q '^[^ ]* /sys/fs/cgroup cgroup2 ' /proc/1/mounts; then
  mount -t cgroup2 cgroup2 /sys/fs/cgroup
else
  mount -t tmpfs -o mode=755 cgroup_root /sys/fs/cgroup
  grep -E '^[^ ]+ /sys/fs/cgroup/[^ ]+ cgroup ' /proc/1/mounts | while read -r _ dir _ opts _; do
    mkdir -p "$dir"; mount -t cgroup -o "$opts" cgroup "$dir"
  done
fi
exec "$@"'''


def test_two_nodes_each_container_in_its_node_namespace(tmp_path):
    """The multi-node script (--network=host) run by podman on node0 and node1 of the
    emulated cluster: each container is in its node's network namespace, named after the
    job and node, and the two meet at the c10d rendezvous on node0 (gloo, CPU)."""
    from cluster.harness import Cluster, kill_tree, skip_reason
    from cluster.jobs import world_sizes

    if skip_reason():
        pytest.skip(skip_reason())
    ckpt = tmp_path / "shared-ckpt"  # one host path = a shared filesystem for both nodes
    steps = 10
    script = render(tmp_path, "--cpu", "--nnodes", "2", "--nproc-per-node", "1", "--fabric", "ethernet",
                    "--rdzv-endpoint", "node0:29400", "--name", "two-node", "--checkpoint-dir", str(ckpt),
                    "--env", "OMP_NUM_THREADS=1", "--grace-period", "60",
                    "--", *TINY, "--steps", str(steps), "--checkpoint-every", str(steps))
    names = ["two-node-node0", "two-node-node1"]
    for name in names:
        podman("rm", "-f", "-t", "0", name)
    with Cluster(2) as cluster:
        procs = [
            node.popen(["sh", "-c", _CGROUPS_AGAIN, "cgroups", "bash", str(script)],
                       env={"LAUNCH_CONTAINER_NAME": name}, cwd=str(tmp_path),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for node, name in zip(cluster.nodes, names)
        ]
        try:
            outs = [p.communicate(timeout=420)[0] for p in procs]
        finally:
            for p in procs:
                kill_tree(p)
            for name in names:
                podman("rm", "-f", "-t", "0", name)
    for name, p, out in zip(names, procs, outs):
        assert p.returncode == 0, f"{name} exited {p.returncode}:\n{out[-4000:]}"
        assert f"podman run --name {name}" in out
    run_dir = ckpt / "two-node"
    rows = [r for r in metrics(run_dir) if "loss" in r]
    assert rows[-1]["step"] == steps
    assert steps_of(run_dir) == [steps]
    assert world_sizes(outs[0] + outs[1]) == [2], outs[0][-3000:]  # one rank per node, one model line
