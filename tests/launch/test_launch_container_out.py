"""``train run`` in a container writes its run directory to the checkpoint volume: every
backend whose training runs in a container (docker/podman, Kubernetes TrainJob and
PyTorchJob, Slurm with pyxis) adds ``--out <checkpoint-dir>/<name>`` when the arguments
have none, keeps the user's ``--out``, and warns when that one is not on a volume that
outlives the container. Bare-metal torchrun and Slurm leave the arguments alone."""

from __future__ import annotations

import pytest

from k8s_checks import render_docs
from launch_testlib import render, run_inproc

CKPT = ["--checkpoint-dir", "/ckpt", "--name", "job-a"]


def _k8s_args(api: str, extra: list[str]) -> list[str]:
    docs = render_docs(["k8s", "--api", api, "--profile", "h100", "--nnodes", "2", *CKPT, "--", *extra])
    if api == "trainjob":
        return next(d for d in docs if d["kind"] == "TrainJob")["spec"]["trainer"]["args"]
    return docs[0]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"]


@pytest.mark.parametrize("api", ["trainjob", "pytorchjob"])
def test_k8s_train_run_defaults_to_the_checkpoint_volume(api):
    assert _k8s_args(api, ["--config", "1b"]) == ["-m", "train", "run", "--out", "/ckpt/job-a", "--config", "1b"]
    assert _k8s_args(api, ["--out=/ckpt/mine", "--resume"]) == ["-m", "train", "run", "--out=/ckpt/mine", "--resume"]


def test_k8s_warns_about_an_out_inside_the_container():
    rc, _, err = run_inproc(["k8s", "--profile", "h100", *CKPT, "--", "--out", "runs/x"])
    assert rc == 0 and "k8s: --out runs/x is not under --checkpoint-dir /ckpt" in err
    rc, _, err = run_inproc(["k8s", "--profile", "h100", *CKPT, "--", "--out", "/ckpt/sub"])
    assert rc == 0 and "warning" not in err


@pytest.mark.parametrize("backend, container", [(["slurm", "--pyxis", "--image", "nvcr.io#nvidia/pytorch:25.12-py3"], True),
                                                (["docker"], True), (["slurm"], False), (["torchrun"], False)])
def test_shell_backends(backend, container):
    script = render([*backend, "--profile", "h100", *CKPT, "--", "--steps", "10"])
    cmd = script[script.index("train_cmd=("):].split(")", 1)[0]
    assert ("--out /ckpt/job-a" in cmd) == container, cmd
    assert "--steps 10" in cmd


def test_pyxis_warns_unless_out_is_on_a_writable_mount():
    base = ["slurm", "--pyxis", "--image", "nvcr.io#nvidia/pytorch:25.12-py3", "--profile", "h100", *CKPT]
    rc, _, err = run_inproc([*base, "--", "--out", "/workspace/run"])
    assert rc == 0 and "slurm --pyxis: --out /workspace/run is not under --checkpoint-dir /ckpt or a writable --mount" in err
    rc, _, err = run_inproc([*base, "--mount", "/data/runs:/runs", "--", "--out", "/runs/x"])
    assert rc == 0 and "warning" not in err
