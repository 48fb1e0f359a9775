"""Each option takes what the tool it reaches takes (docs/launch.md, "Accepted values"): valid
values reach the render byte for byte (Kubernetes quantities in their canonical form: .5 as 0.5,
no + sign), invalid ones are one line and exit 2."""

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
    # apimachinery's quantity grammar: a sign, .5 and 5. numbers, n / u suffixes
    (["k8s", "--cpus"], ".5", '"cpu": "0.5"'),
    (["k8s", "--cpus"], "+4", '"cpu": "4"'),
    (["k8s", "--cpus"], "500000u", '"cpu": "500000u"'),
    (["k8s", "--cpus"], "1000000000n", '"cpu": "1000000000n"'),
    (["k8s", "--memory"], "1.Gi", '"memory": "1Gi"'),
    (["slurm", "--memory"], "1e3", "#SBATCH --mem=1M"),  # 1000 bytes, rounded up to whole MiB
    (["slurm", "--memory"], "129e6", "#SBATCH --mem=124M"),
    (["slurm", "--cpus"], "+8", "#SBATCH --cpus-per-task=8"),
    # Kubernetes' variable names take '.' and '-' (no shell between the pod's env and torchrun)
    (["k8s", "--env"], "A.B=1", '- name: "A.B"'),
    (["k8s", "--env"], "my-var=1", '- name: "my-var"'),
    (["k8s", "--env-secret"], "my.token=hf-secret:token", '- name: "my.token"'),
    (["k8s", "--api", "pytorchjob", "--env"], "my-var=1", '- name: "my-var"'),
    # resolvers (glibc, docker's DNS) answer names with '_', as the script's run-time override does
    (["torchrun", "--nnodes", "2", "--rdzv-endpoint"], "node_1:29500", "rdzv_endpoint=node_1:29500"),
    # a container name may end in '-', '_' or '.'; the rendezvous id derived from it drops them
    (["slurm", "--name"], "run1-", "#SBATCH --job-name=run1-"),
    (["torchrun", "--nnodes", "2", "--rdzv-endpoint", "h:1", "--name"], "run1.", "--rdzv-id run1\n"),
    (["docker", "--name"], "run_1_", "container_name=${LAUNCH_CONTAINER_NAME:-run_1_}"),
    # pyxis mount flags (ro, rw, propagation) joined with '+' (pyxis: "ro+rprivate")
    (["slurm", "--pyxis", "--image", "nvcr.io/nvidia/pytorch:24.01-py3", "--mount"], "/data:/data:ro,rprivate",
     "--container-mounts=/data:/data:ro+rprivate,"),
    (["k8s", "--queue"], "team-a.gpu", '"kueue.x-k8s.io/queue-name": "team-a.gpu"'),
]
INVALID = [
    (["slurm", "--name"], "a b"), (["docker", "--name"], "-x"), (["k8s", "--name"], "llama.8b_run1"),
    (["docker", "--mount"], "/d:/d:ro,rw"), (["docker", "--mount"], "/d:/d:z,Z"), (["docker", "--mount"], "/d:/d:q"),
    (["slurm", "--pyxis", "--mount"], "/d:/d:z"), (["k8s", "--memory"], "500e"), (["k8s", "--cpus"], "1e999"),
    (["slurm", "--time"], "1:2:3:4"), (["k8s", "--memory"], "0"),
    (["k8s", "--cpus"], "-1"), (["k8s", "--cpus"], "1n"), (["k8s", "--cpus"], "."), (["slurm", "--memory"], "5m"),
    (["torchrun", "--env"], "my-var=1"), (["slurm", "--env"], "A.B=1"), (["k8s", "--env"], "1a=1"),
    (["k8s", "--env"], "..a=1"), (["torchrun", "--nnodes", "2", "--rdzv-endpoint"], "node 1:29500"),
    (["docker", "--registry"], "my_registry.io"),
    # Kueue takes a LocalQueue name (DNS-1123, lower case); a link-local %zone names no shared link
    (["k8s", "--queue"], "Team_A"), (["k8s", "--queue"], "team-a."),
    (["torchrun", "--nnodes", "2", "--rdzv-endpoint"], "[fe80::1%eth0]:29500"),
    (["slurm", "--pyxis", "--image", "nvcr.io/nvidia/pytorch:24.01-py3", "--mount"], "/d:/d:ro,cached"),
]


@pytest.mark.parametrize(("argv", "value", "line"), VALID, ids=lambda v: str(v))
def test_values_the_target_accepts_render_unchanged(argv, value, line):
    assert line in render([*argv, value])


@pytest.mark.parametrize(("argv", "value"), INVALID, ids=lambda v: str(v))
def test_values_the_target_refuses_are_one_line(argv, value):
    rc, out, err = run_inproc([*argv, value])
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(("argv", "named"), [
    (["docker", "--cpus", "8", "--memory", "64Gi"], "docker: --cpus, --memory not rendered"),
    (["torchrun", "--mount", "/data:/data"], "torchrun: --mount not rendered"),
    (["slurm", "--nnodes", "2", "--rdzv-endpoint", "10.1.2.3:29999"], "slurm: --rdzv-endpoint's host not rendered"),
    (["k8s", "--api", "pytorchjob", "--nnodes", "2", "--rdzv-endpoint", "h:29500"],
     "k8s: --rdzv-endpoint's host not rendered"),
    (["slurm", "--pyxis", "--image", "nvcr.io/nvidia/pytorch:24.01-py3@sha256:" + "a" * 64],
     "enroot reads from version 4.0 on"),
])
def test_options_a_backend_does_not_render_are_named(argv, named):
    """Given but not used by the backend (or not by every version of it): rendered all the same,
    with one warning line naming them."""
    rc, out, err = run_inproc(argv)
    assert rc == 0, err
    assert [ln for ln in err.splitlines() if named in ln], err
