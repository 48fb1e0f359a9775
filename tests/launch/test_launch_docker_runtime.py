"""Run-time decisions of the rendered `launch docker` script: engine detection, GPU flags
per engine, locked-memory limits of rootless engines, LAUNCH_GPUS. The script runs for
real (real bash, real `ulimit`, real mkdir/stat); only the engine binary is the recording
stub of launch_testlib (the real-podman runs are tests/docker/test_launch_podman.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from launch_testlib import read_record, render, write_stubs

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def sandbox(tmp_path):
    bindir, record = tmp_path / "bin", tmp_path / "record.json"
    write_stubs(bindir, record)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAUNCH_")}
    env.update(PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}", HOME=str(tmp_path))
    return tmp_path, bindir, record, env


def _script(tmp: Path, *argv: str) -> Path:
    path = tmp / "job.sh"
    path.write_text(render(["docker", "--checkpoint-dir", str(tmp / "ckpt"), *argv]))
    return path


def _run(script: Path, env: dict, memlock_kib: int | None = None) -> subprocess.CompletedProcess:
    cmd = ["bash", str(script)]
    if memlock_kib is not None:  # a user whose hard memlock limit is small (the usual default)
        cmd = ["bash", "-c", f'ulimit -H -l {memlock_kib} && exec bash "$0"', str(script)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


def test_docker_gets_gpus_flag_and_memlock(sandbox):
    tmp, _, record, env = sandbox
    proc = _run(_script(tmp, "--profile", "h100"), env)
    assert proc.returncode == 0, proc.stderr
    opts = read_record(record, ".docker")["opts"]
    assert "--gpus=all" in opts and "--ulimit=memlock=-1" in opts and "--name=train" in opts
    assert not any(o.startswith("--device=nvidia.com/gpu") for o in opts)


def test_podman_detected_uses_cdi_devices(sandbox):
    tmp, bindir, record, env = sandbox
    (bindir / "docker").rename(bindir / "podman")  # only podman on PATH before the system's
    env["PATH"] = f"{bindir}{os.pathsep}/usr/bin:/bin"
    if shutil.which("docker", path=env["PATH"]):
        pytest.skip("a docker binary in /usr/bin or /bin would be detected first")
    proc = _run(_script(tmp, "--profile", "h100"), {**env, "LAUNCH_ROOTLESS": "0"})
    assert proc.returncode == 0, proc.stderr
    assert "podman run --name train" in proc.stderr
    opts = read_record(record, ".docker")["opts"]
    assert "--device=nvidia.com/gpu=all" in opts and "--security-opt=label=disable" in opts
    assert not any(o.startswith("--gpus") for o in opts), "podman ignores --gpus silently"


def test_gpu_selection_and_cpu_mode(sandbox):
    tmp, _, record, env = sandbox
    script = _script(tmp, "--profile", "h100")
    proc = _run(script, {**env, "LAUNCH_GPUS": "0,3", "LAUNCH_ENGINE": "docker"})
    assert proc.returncode == 0, proc.stderr
    assert '--gpus="device=0,3"' in read_record(record, ".docker")["opts"]
    # UUIDs and MIG devices, as the NVIDIA Container Toolkit (docker) and CDI (podman) name them
    uuid = "GPU-3a23c669-1f69-c64e-cf85-44e9b07e7a2a"
    proc = _run(script, {**env, "LAUNCH_GPUS": f"{uuid},0:1", "LAUNCH_ENGINE": "docker"})
    assert proc.returncode == 0, proc.stderr
    assert f'--gpus="device={uuid},0:1"' in read_record(record, ".docker")["opts"]
    proc = _run(script, {**env, "LAUNCH_GPUS": "none"})
    assert proc.returncode == 0, proc.stderr
    opts = read_record(record, ".docker")["opts"]
    assert not any(o.startswith(("--gpus", "--ulimit=memlock")) for o in opts)
    for bad in ("LAUNCH_GPUS", "LAUNCH_ENGINE"):
        proc = _run(script, {**env, bad: "nvidia; rm -rf /"})
        assert proc.returncode == 2 and f"{bad}=nvidia; rm -rf /" in proc.stderr
        assert proc.stderr.count("\n") == 1, proc.stderr


def test_rootless_memlock_explained(sandbox):
    tmp, _, record, env = sandbox
    env = {**env, "LAUNCH_ENGINE": "podman", "LAUNCH_ROOTLESS": "1"}
    (tmp / "bin" / "podman").symlink_to(tmp / "bin" / "docker")
    # GPUs over NVLink: memlock is left out with a note, the job starts
    proc = _run(_script(tmp, "--profile", "h100"), env, memlock_kib=8192)
    assert proc.returncode == 0, proc.stderr
    assert "rootless podman: your hard memlock limit is 8192 KiB" in proc.stderr
    opts = read_record(record, ".docker")["opts"]
    assert "--ulimit=memlock=-1" not in opts
    assert "--userns=keep-id" in opts and f"--user={os.getuid()}:{os.getgid()}" in opts
    # RDMA fabric: NCCL would fail to register memory; refuse before starting anything
    Path(str(record) + ".docker").unlink()
    script = _script(tmp, "--profile", "h100", "--nnodes", "2", "--fabric", "infiniband", "--rdzv-endpoint", "n0")
    proc = _run(script, env, memlock_kib=8192)
    assert proc.returncode == 2 and "cannot grant --ulimit memlock=-1" in proc.stderr
    assert not Path(str(record) + ".docker").exists()
    # an unlimited hard limit (limits.conf) keeps the flag
    if subprocess.run(["bash", "-c", "ulimit -H -l"], capture_output=True, text=True).stdout.strip() == "unlimited":
        proc = _run(script, env)
        assert proc.returncode == 0 and "--ulimit=memlock=-1" in read_record(record, ".docker")["opts"]


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to the image's user needs root")
def test_checkpoint_dir_ownership(sandbox):
    tmp, _, record, env = sandbox
    env = {**env, "LAUNCH_ENGINE": "docker", "LAUNCH_ROOTLESS": "0"}
    script = _script(tmp, "--cpu")
    proc = _run(script, env)  # fresh: created and handed to the image's user
    assert proc.returncode == 0, proc.stderr
    assert (tmp / "ckpt").stat().st_uid == 1000
    assert not any(o.startswith("--user") for o in read_record(record, ".docker")["opts"])
    os.chown(tmp / "ckpt", 4242, 4343)  # someone else's directory: run as its owner
    proc = _run(script, env)
    assert proc.returncode == 0, proc.stderr
    assert "belongs to 4242:4343" in proc.stderr
    assert {"--user=4242:4343", "--env=HOME=/tmp"} <= set(read_record(record, ".docker")["opts"])


@pytest.mark.parametrize(("name", "value"), [
    ("LAUNCH_IMAGE_USER", "abc"), ("LAUNCH_IMAGE_USER", "1000"), ("LAUNCH_IMAGE_USER", "0:0;id"),
    ("LAUNCH_ROOTLESS", "true"), ("LAUNCH_ROOTLESS", "2"),
    ("LAUNCH_CONTAINER_NAME", "a b"), ("LAUNCH_CONTAINER_NAME", "-x"),
])
def test_a_bad_override_is_one_line_before_anything_is_created(sandbox, name, value):
    """A typo in an override stops the script with one line, exit 2, and no checkpoint
    directory: one created and chowned by a failed run would decide the next run's user."""
    tmp, _, record, env = sandbox
    proc = _run(_script(tmp, "--profile", "h100"), {**env, name: value})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and f"{name}=" in proc.stderr, proc.stderr
    assert not (tmp / "ckpt").exists() and not record.exists()
