"""Each option takes what the tool it reaches takes (docs/launch.md, "Accepted values"): valid
values reach the render byte for byte, invalid ones are one line and exit 2."""

from __future__ import annotations

import pytest

from launch_testlib import render, run_inproc

VALID = [
    (["slurm", "--name"], "llama.8b_run1", "#SBATCH --job-name=llama.8b_run1"),
    (["docker", "--name"], "Run_1.a-b", "container_name=${LAUNCH_CONTAINER_NAME:-Run_1.a-b}"),
    (["docker", "--mount"], "/data:/data:z", "--volume=/data:/data:z"),
    (["docker", "--mount"], "/data:/data:Z", "--volume=/data:/data:Z"),
    (["docker", "--mount"], "/data:/data:ro,z", "'--volume=/data:/data:ro,z'"),
    (["docker", "--mount"], "/data:/data:rw,rslave", "'--volume=/data:/data:rw,rslave'"),
    (["k8s", "--memory"], "500e6", '"memory": "500e6"'),
    (["k8s", "--cpus"], "1E2", '"cpu": "1E2"'),
    (["k8s", "--shm-size"], "1E", 'sizeLimit: "1E"'),
    (["slurm", "--time"], "2-12:00:00", "#SBATCH --time=2-12:00:00"),
    (["slurm", "--memory"], "0", "#SBATCH --mem=0"),
]
INVALID = [
    (["slurm", "--name"], "a b"), (["docker", "--name"], "-x"), (["k8s", "--name"], "llama.8b_run1"),
    (["docker", "--mount"], "/d:/d:ro,rw"), (["docker", "--mount"], "/d:/d:z,Z"), (["docker", "--mount"], "/d:/d:q"),
    (["slurm", "--pyxis", "--mount"], "/d:/d:z"), (["k8s", "--memory"], "500e"), (["k8s", "--cpus"], "1e999"),
    (["slurm", "--time"], "1:2:3:4"), (["k8s", "--memory"], "0"),
]


@pytest.mark.parametrize(("argv", "value", "line"), VALID, ids=lambda v: str(v))
def test_values_the_target_accepts_render_unchanged(argv, value, line):
    assert line in render([*argv, value])


@pytest.mark.parametrize(("argv", "value"), INVALID, ids=lambda v: str(v))
def test_values_the_target_refuses_are_one_line(argv, value):
    rc, out, err = run_inproc([*argv, value])
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
