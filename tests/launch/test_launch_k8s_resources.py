"""Kubernetes trainer pods: CPU and memory from the profile (``k8s.resources``) or --cpus / --memory,
the memory-backed /dev/shm (--shm-size), and the checkpoint claim's access mode
(--pvc-access-mode) against the node count. Every render also passes k8s_checks.check_manifests
(the CRD schemas and operator rules)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from k8s_checks import check_manifests, one_kind, render_docs
from launch_testlib import REPO, run_inproc

pytestmark = pytest.mark.timeout(300)

H100 = REPO / "core" / "profiles" / "h100.yaml"


def _container(docs: list[dict]) -> dict:
    job = one_kind(docs, "PyTorchJob", "TrainingRuntime", "ClusterTrainingRuntime")
    if job["kind"] == "PyTorchJob":
        pod = next(iter(job["spec"]["pytorchReplicaSpecs"].values()))["template"]["spec"]
    else:
        pod = job["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    return pod["containers"][0] | {"volumes": pod["volumes"]}


@pytest.mark.parametrize("argv", [
    ["k8s", "--profile", "h100"],
    ["k8s-runtime", "--profile", "h100"],
    ["k8s", "--api", "pytorchjob", "--profile", "h100", "--nnodes", "2", "--fabric", "infiniband"],
])
def test_the_profile_sets_the_cpu_request_and_the_memory_request_and_limit(argv):
    docs = render_docs(argv)
    check_manifests(docs)
    resources = _container(docs)["resources"]
    profile = yaml.safe_load(H100.read_text())["k8s"]["resources"]
    assert resources["requests"]["cpu"] == profile["cpu"]["value"]
    assert "cpu" not in resources["limits"]  # no CFS quota on the data-loader and NCCL threads
    assert resources["requests"]["memory"] == resources["limits"]["memory"] == profile["memory"]["value"]


def test_cpus_and_memory_override_the_profile():
    docs = render_docs(["k8s", "--api", "pytorchjob", "--profile", "h100", "--cpus", "48", "--memory", "700Gi"])
    check_manifests(docs)
    resources = _container(docs)["resources"]
    assert resources == {"limits": {"nvidia.com/gpu": "8", "memory": "700Gi"},
                         "requests": {"nvidia.com/gpu": "8", "cpu": "48", "memory": "700Gi"}}
    # a TrainJob carries only what was given; the runtime pod holds the same values
    docs = render_docs(["k8s", "--profile", "h100", "--memory", "700Gi"])
    check_manifests(docs)
    per_node = one_kind(docs, "TrainJob")["spec"]["trainer"]["resourcesPerNode"]
    assert per_node == {"limits": {"nvidia.com/gpu": "8", "memory": "700Gi"},
                        "requests": {"nvidia.com/gpu": "8", "memory": "700Gi"}}
    assert _container(docs)["resources"]["requests"]["cpu"] == "96"


def test_a_profile_without_k8s_resources_requests_only_gpus():
    docs = render_docs(["k8s", "--profile", "generic"])
    check_manifests(docs)
    assert _container(docs)["resources"] == {"limits": {"nvidia.com/gpu": "8"}, "requests": {"nvidia.com/gpu": "8"}}


def test_the_runtime_name_follows_the_resources():
    def name(*extra):
        return render_docs(["k8s-runtime", "--profile", "h100", *extra])[0]["metadata"]["name"]

    assert len({name(), name("--cpus", "48"), name("--memory", "700Gi")}) == 3
    assert name() == name("--pvc-access-mode", "ReadWriteOnce")  # a comment, not content


@pytest.mark.parametrize("key,value", [("cpu", "lots"), ("memory", "0"), ("cpu", "1.0001m")])
def test_a_bad_profile_quantity_is_one_line_naming_the_field(tmp_path, key, value):
    data = yaml.safe_load(H100.read_text())
    data["k8s"]["resources"][key]["value"] = value
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    rc, out, err = run_inproc(["k8s", "--profile", str(path)])
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert f"k8s.resources.{key}" in err and repr(value) in err and "Traceback" not in err


def test_shm_size_sets_the_size_limit_and_warns_at_the_memory_limit():
    rc, out, err = run_inproc(["k8s", "--profile", "h100", "--shm-size", "200Gi"])
    assert rc == 0 and "/dev/shm" not in err
    dshm = next(v for v in _container(list(yaml.safe_load_all(out)))["volumes"] if v["name"] == "dshm")
    assert dshm["emptyDir"] == {"medium": "Memory", "sizeLimit": "200Gi"}
    assert "Memory-backed /dev/shm of 200Gi (--shm-size)" in out
    rc, out, err = run_inproc(["k8s", "--profile", "h100", "--shm-size", "256Gi", "--memory", "256Gi"])
    assert rc == 0 and "--shm-size 256Gi is not below the pod's memory limit 256Gi" in err


@pytest.mark.parametrize("argv", [
    ["k8s", "--nnodes", "2"],
    ["k8s", "--nnodes", "2", "--runtime", "shared"],  # no pod rendered: the TrainJob is checked alone
    ["k8s", "--api", "pytorchjob", "--nnodes", "2"],
    ["k8s", "--nnodes", "1:3"],  # elastic: up to 3 nodes
    ["k8s-runtime", "--nnodes", "2"],
])
@pytest.mark.parametrize("mode", ["ReadWriteOnce", "ReadWriteOncePod"])
def test_a_multi_node_job_on_a_single_node_claim_is_refused(tmp_path, argv, mode):
    target = tmp_path / "job.yaml"
    target.write_text("# Generated by: launch k8s\nkept\n")  # an earlier render: -o may replace it
    rc, out, err = run_inproc([*argv, "--pvc", "ckpt", "--pvc-access-mode", mode, "-o", str(target)])
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert f"--pvc-access-mode {mode}" in err and "'ckpt'" in err and "ReadWriteMany" in err
    assert target.read_text() == "# Generated by: launch k8s\nkept\n"


def test_a_read_only_claim_is_refused_and_single_node_claims_render():
    rc, _, err = run_inproc(["k8s", "--pvc-access-mode", "ReadOnlyMany"])
    assert rc == 2 and "writable" in err and len(err.strip().splitlines()) == 1
    for mode in ("ReadWriteOnce", "ReadWriteOncePod"):
        rc, out, err = run_inproc(["k8s", "--profile", "h100", "--pvc-access-mode", mode])
        assert rc == 0, err
        assert f"declared {mode} (--pvc-access-mode)" in out
        check_manifests(list(yaml.safe_load_all(out)))
    rc, out, _ = run_inproc(["k8s", "--nnodes", "2"])
    assert rc == 0 and "declared ReadWriteMany (--pvc-access-mode)" in out
    rc, _, err = run_inproc(["k8s", "--pvc-access-mode", "ReadWriteSometimes"])
    assert rc == 2 and "--pvc-access-mode" in err


def test_the_committed_manifests_state_the_claim_mode_and_shm():
    for path in sorted((REPO / "k8s").glob("*.yaml")):
        text = path.read_text()
        if "persistentVolumeClaim" in text:
            assert "(--pvc-access-mode)" in text and "(--shm-size)" in text, Path(path).name
