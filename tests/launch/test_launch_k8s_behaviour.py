"""Kubernetes manifests: what the options do (API choice, replicas, runtime vs TrainJob, GB200
ComputeDomain, options, operator limits, hostile values); each render also passes
k8s_checks.check_manifests (the API-server and operator checks of test_launch_k8s.py)."""

from __future__ import annotations

import json
import re

import pytest

from k8s_checks import check_manifests, one_kind, render_docs
from k8s_operators import (
    jobset_webhook,
    pytorchjob_injected_env,
    pytorchjob_webhook_errors,
    runtime_webhook_errors,
    trainer_jobset,
    trainjob_webhook_errors,
)
from launch_testlib import hostile_values, render, run_inproc

pytestmark = pytest.mark.timeout(300)


# --------------------------------------------------------------------------- behaviour


def test_api_choice_and_elastic_needs_pytorchjob():
    assert [d["kind"] for d in render_docs(["k8s", "--profile", "h100"])] == ["TrainingRuntime", "TrainJob"]
    elastic = render_docs(["k8s", "--profile", "h100", "--nnodes", "1:4", "--fabric", "infiniband"])
    assert [d["kind"] for d in elastic] == ["PyTorchJob"]
    rc, _, err = run_inproc(["k8s", "--api", "trainjob", "--nnodes", "1:4", "--fabric", "infiniband"])
    assert rc == 2 and "Trainer v2 (TrainJob) has no elastic mode" in err and "--api pytorchjob" in err
    rc, _, err = run_inproc(["k8s-runtime", "--nnodes", "1:4", "--fabric", "infiniband"])
    assert rc == 2 and "no elastic mode" in err


def test_replica_layout():
    (single,) = render_docs(["k8s", "--api", "pytorchjob", "--profile", "h100"])
    assert list(single["spec"]["pytorchReplicaSpecs"]) == ["Master"] and "elasticPolicy" not in single["spec"]
    (multi,) = render_docs(["k8s", "--api", "pytorchjob", "--profile", "h100", "--nnodes", "3", "--fabric", "infiniband"])
    assert {r: s["replicas"] for r, s in multi["spec"]["pytorchReplicaSpecs"].items()} == {"Master": 1, "Worker": 2}
    (elastic,) = render_docs(["k8s", "--profile", "h100", "--nnodes", "1:4", "--fabric", "infiniband", "--gang"])
    assert {r: s["replicas"] for r, s in elastic["spec"]["pytorchReplicaSpecs"].items()} == {"Worker": 4}
    policy = elastic["spec"]["elasticPolicy"]
    assert (policy["minReplicas"], policy["maxReplicas"], policy["maxRestarts"]) == (1, 4, 3)
    assert elastic["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 1}
    trainjob = one_kind(render_docs(["k8s", "--profile", "h100", "--nnodes", "3", "--fabric", "infiniband"]), "TrainJob")
    assert trainjob["spec"]["trainer"]["numNodes"] == 3 and trainjob["spec"]["trainer"]["numProcPerNode"] == 8


def test_runtime_carries_profile_and_fabric_trainjob_only_per_job_things():
    options = ["--profile", "h100", "--nnodes", "2", "--fabric", "infiniband", "--gang", "--grace-period", "600",
               "--node-selector", "pool=a100", "--image-pull-secret", "regcred", "--shm-size", "32Gi"]
    (runtime,) = render_docs(["k8s-runtime", *options, "--runtime", "h100-ib"])
    (trainjob,) = render_docs(["k8s", *options, "--runtime", "h100-ib", "--queue", "team-a", "--image",
                               "reg.example.com/img:1", "--cpus", "64", "--env", "MY_FLAG=1", "--", "--config", "tiny"])
    assert trainjob["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                                              "name": "h100-ib"} and runtime["metadata"]["name"] == "h100-ib"
    assert runtime["spec"]["podGroupPolicy"] == {"coscheduling": {"scheduleTimeoutSeconds": 300}}
    pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["terminationGracePeriodSeconds"] == 600 and pod["nodeSelector"]["pool"] == "a100"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert container["resources"]["limits"]["rdma/ib"] == "1" and container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert {e["name"]: e["value"] for e in container["env"]}["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "570"
    assert trainjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert trainjob["spec"]["trainer"]["image"] == "reg.example.com/img:1"
    assert trainjob["spec"]["trainer"]["env"] == [{"name": "MY_FLAG", "value": "1"}]
    # --cpus: a request only (no CFS quota); the memory request and limit stay the runtime's (the profile's)
    assert trainjob["spec"]["trainer"]["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": "8"},
                                                               "requests": {"nvidia.com/gpu": "8", "cpu": "64"}}
    assert container["resources"]["requests"]["memory"] == container["resources"]["limits"]["memory"] == "1Ti"
    check_manifests([runtime])
    check_manifests([trainjob], {runtime["metadata"]["name"]: runtime})


def test_runtime_name_follows_the_runtime_content():
    def name(*extra):
        return render_docs(["k8s-runtime", "--profile", "h100", *extra])[0]["metadata"]["name"]

    assert name() == name("--image", "reg.example.com/o:2") and name().startswith("h100-nvlink-")
    assert name("--gang") != name() and name("--shm-size", "8Gi") != name() and name("--runtime", "mine") == "mine"


@pytest.mark.parametrize("extra", [
    [], ["--gang"], ["--shm-size", "8Gi"], ["--nnodes", "2", "--fabric", "infiniband", "--gang"],
    ["--namespace", "ml", "--node-selector", "pool=a"], ["--profile", "gb200", "--nnodes", "2"],
    ["--grace-period", "900", "--env", "X=1", "--", "--steps", "3"], ["--backoff-limit", "0", "--ttl-seconds", "60"],
])
def test_a_trainjob_always_names_a_runtime_it_brings(extra):
    """However the options change, the file holds the runtime its TrainJob names (same kind, name and
    namespace): applied together, the reference cannot dangle."""
    docs = render_docs(["k8s", "--profile", "h100", "--name", "job-a", *extra])
    job = one_kind(docs, "TrainJob")
    ref = job["spec"]["runtimeRef"]
    runtime = one_kind(docs, "TrainingRuntime")
    assert (ref["kind"], ref["name"]) == ("TrainingRuntime", runtime["metadata"]["name"])
    assert runtime["metadata"].get("namespace") == job["metadata"].get("namespace")
    check_manifests(docs)


def test_a_chosen_cluster_runtime_name_is_the_reference():
    (job,) = render_docs(["k8s", "--profile", "h100", "--runtime", "h100-team", "--gang"])
    (runtime,) = render_docs(["k8s-runtime", "--profile", "h100", "--runtime", "h100-team", "--gang"])
    assert job["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"] == "h100-team"
    assert job["spec"]["runtimeRef"]["kind"] == runtime["kind"] == "ClusterTrainingRuntime"
    check_manifests([job], {"h100-team": runtime})


def test_runtime_and_trainjob_refuse_misplaced_options():
    for argv, text in (
        (["k8s-runtime", "--queue", "q"], "--queue is per job"),
        (["k8s-runtime", "--namespace", "ml"], "cluster-scoped"),
        (["k8s-runtime", "--env-secret", "T=s:k"], "per job"),
        (["k8s-runtime", "--", "--steps", "3"], "per job"),
        (["k8s-runtime", "--profile", "gb200", "--nnodes", "2"], "ComputeDomain per job"),
        (["k8s", "--env", "PET_NNODES=3"], "reserved"),
        (["k8s", "--api", "pytorchjob", "--runtime", "x"], "--runtime"),
    ):
        rc, out, err = run_inproc(argv)
        assert rc == 2 and text in err and not out, (argv, err)
        assert len(err.strip().splitlines()) == 1


def test_gb200_single_tray_needs_no_imex():
    for argv in (["k8s", "--profile", "gb200"], ["k8s", "--api", "pytorchjob", "--profile", "gb200"],
                 ["k8s-runtime", "--profile", "gb200"]):
        docs = render_docs(argv)
        assert "ComputeDomain" not in {d["kind"] for d in docs}
        assert "NCCL_MNNVL_ENABLE" not in render(argv) and "resourceClaims" not in render(argv)
    # the bare-metal backends leave MNNVL to NCCL's auto-detection (no IMEX domain is rendered)
    for backend in ("env", "torchrun", "slurm"):
        assert "NCCL_MNNVL_ENABLE" not in render([backend, "--profile", "gb200", "--nnodes", "2", "--rdzv-endpoint", "n0"])


@pytest.mark.parametrize("api", ["trainjob", "pytorchjob"])
def test_gb200_multi_node_gets_a_compute_domain(api):
    docs = render_docs(["k8s", "--api", api, "--profile", "gb200", "--nnodes", "2", "--name", "nvl", "--namespace", "ml"])
    kinds = [d["kind"] for d in docs]
    assert kinds == (["ComputeDomain", "TrainingRuntime", "TrainJob"] if api == "trainjob" else ["ComputeDomain", "PyTorchJob"])
    domain = docs[0]
    assert domain["metadata"] == {"name": "nvl-imex", "namespace": "ml", "labels": {
        "app.kubernetes.io/name": "nvl", "app.kubernetes.io/managed-by": "launch"}}
    assert domain["spec"] == {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": "nvl-imex-channel"}}}
    check_manifests(docs)
    pods = ([r["template"]["spec"]["template"]["spec"] for r in docs[1]["spec"]["template"]["spec"]["replicatedJobs"]]
            if api == "trainjob" else [r["template"]["spec"] for r in docs[1]["spec"]["pytorchReplicaSpecs"].values()])
    labels = (docs[1]["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]["labels"]
              if api == "trainjob" else docs[1]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["metadata"]["labels"])
    for pod in pods:
        term = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        assert term["labelSelector"]["matchLabels"].items() <= labels.items()
    elastic = render_docs(["k8s", "--profile", "gb200", "--nnodes", "2:4", "--fabric", "efa",
                            "--rdma-resource", "vpc.amazonaws.com/efa=8"])
    assert elastic[0]["spec"]["numNodes"] == 0  # node count not fixed (driver >= 25.8 default mode)
    check_manifests(elastic)
    off = render_docs(["k8s", "--api", api, "--profile", "gb200", "--nnodes", "2", "--no-compute-domain"])
    assert "ComputeDomain" not in {d["kind"] for d in off}


def test_k8s_options():
    docs = render_docs([
        "k8s", "--api", "pytorchjob", "--profile", "gb200", "--nnodes", "2", "--fabric", "roce", "--ib-hca",
        "=mlx5_0", "--name", "opts", "--namespace", "ml", "--queue", "team-a", "--pvc", "ckpt-claim",
        "--shm-size", "128Gi", "--grace-period", "900", "--image-pull-secret", "regcred",
        "--node-selector", "nvidia.com/gpu.clique=abc.1", "--pod-annotation",
        "k8s.v1.cni.cncf.io/networks=roce-net", "--rdma-resource", "rdma/rdma_shared_device_a=2",
        "--env-secret", "HF_TOKEN=hf-secret:token", "--cpus", "64", "--memory", "512Gi",
    ])
    check_manifests(docs)
    job = one_kind(docs, "PyTorchJob")
    assert job["metadata"]["namespace"] == "ml"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert "kueue.x-k8s.io/queue-name" not in one_kind(docs, "ComputeDomain")["metadata"]["labels"]
    pod = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    assert pod["metadata"]["annotations"] == {"k8s.v1.cni.cncf.io/networks": "roce-net"}
    spec = pod["spec"]
    assert spec["terminationGracePeriodSeconds"] == 900
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["nodeSelector"] == {"kubernetes.io/arch": "arm64", "nvidia.com/gpu.present": "true",
                                    "nvidia.com/gpu.clique": "abc.1"}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["checkpoints"]["persistentVolumeClaim"]["claimName"] == "ckpt-claim"
    assert volumes["dshm"]["emptyDir"]["sizeLimit"] == "128Gi"
    container = spec["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "4", "rdma/rdma_shared_device_a": "2",
                                                 "memory": "512Gi"}
    assert container["resources"]["requests"] == {"nvidia.com/gpu": "4", "rdma/rdma_shared_device_a": "2",
                                                   "cpu": "64", "memory": "512Gi"}
    env = {e["name"]: e for e in container["env"]}
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-secret", "key": "token"}}}
    assert env["NCCL_MNNVL_ENABLE"]["value"] == "1"
    assert env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]["value"] == "870"


def test_plain_secret_env_warns():
    rc, out, err = run_inproc(["k8s", "--env", "WANDB_API_KEY=abc"])
    assert rc == 0 and "--env-secret" in err


def test_long_name_rejected_for_operator_services():
    rc, _, err = run_inproc(["k8s", "--api", "pytorchjob", "--name", "a" * 56, "--nnodes", "12", "--fabric", "infiniband"])
    assert rc == 2 and "exceed 63" in err
    # JobSet's webhook: <name>-node-0-<index>-<5 random> within 63 characters
    longest_ok = "a" * (63 - len("-node-0-11-xxxxx"))
    docs = render_docs(["k8s", "--name", longest_ok, "--nnodes", "12", "--fabric", "infiniband"])
    check_manifests(docs)
    job, runtime = one_kind(docs, "TrainJob"), one_kind(docs, "TrainingRuntime")
    rc, _, err = run_inproc(["k8s", "--name", longest_ok + "a", "--nnodes", "12", "--fabric", "infiniband"])
    assert rc == 2 and "exceed 63" in err
    assert jobset_webhook(trainer_jobset(
        {**job, "metadata": {**job["metadata"], "name": longest_ok + "a"}}, runtime))[1]


def test_operator_rules_reject_what_the_operators_reject():
    """The written-down webhook rules are not vacuous: each one rejects its violation."""
    (pj,) = render_docs(["k8s", "--api", "pytorchjob", "--profile", "h100", "--nnodes", "2", "--fabric", "infiniband"])
    bad = json.loads(json.dumps(pj))
    bad["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    bad["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] = "main"
    bad["spec"]["pytorchReplicaSpecs"]["Chief"] = bad["spec"]["pytorchReplicaSpecs"]["Worker"]
    errors = pytorchjob_webhook_errors(bad)
    assert any("Master.replicas" in e for e in errors) and any("no container named pytorch" in e for e in errors)
    assert any("Chief" in e for e in errors)
    (runtime,) = render_docs(["k8s-runtime", "--profile", "h100"])
    bad = json.loads(json.dumps(runtime))
    bad["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["name"] = "trainer"
    assert runtime_webhook_errors(bad) and not runtime_webhook_errors(runtime)
    job = one_kind(render_docs(["k8s", "--profile", "h100"]), "TrainJob")
    job["spec"]["trainer"]["env"] = [{"name": "PET_NNODES", "value": "3"}]
    assert any("reserved envs" in e for e in trainjob_webhook_errors(job, runtime))
    # the injected environment: a 3-node fixed PyTorchJob, worker 1 is node rank 2
    (pj,) = render_docs(["k8s", "--api", "pytorchjob", "--profile", "h100", "--nnodes", "3", "--fabric", "infiniband"])
    env = pytorchjob_injected_env(pj, "Worker", 1)
    assert (env["PET_NODE_RANK"], env["PET_NNODES"], env["WORLD_SIZE"], env["PET_NPROC_PER_NODE"]) == ("2", "3", "24", "8")


@pytest.mark.parametrize("api", ["trainjob", "pytorchjob"])
def test_hostile_values_survive_yaml_and_kubernetes_expansion(tmp_path, api):
    values = hostile_values(tmp_path / "CANARY")
    argv = ["k8s", "--api", api, "--profile", "h100", "--checkpoint-dir", "/ck pt/$(HOME)/'q\"", "--flight-recorder"]
    for i, value in enumerate(values):
        argv += ["--env", f"HOSTILE_{i}={value}"]
    docs = render_docs([*argv, "--", *values])
    runtime_argv = [a if a != "trainjob" else "pytorchjob" for a in argv]  # same options, runtime side
    runtimes = {}
    if api == "trainjob":
        (runtime,) = render_docs(["k8s-runtime", *runtime_argv[3:]])
        runtimes[runtime["metadata"]["name"]] = runtime
        check_manifests([runtime])
    check_manifests(docs, runtimes)

    def expand(text: str) -> str:  # what the kubelet does with $(VAR) / $$ in args and env values
        return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: "$" if m.group(0) == "$$" else "<EXPANDED>", text)

    if api == "pytorchjob":
        container = docs[0]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
        args, env_items = container["args"], container["env"]
        static_env = env_items
    else:
        job, runtime = one_kind(docs, "TrainJob"), one_kind(docs, "TrainingRuntime")
        args, env_items = job["spec"]["trainer"]["args"], job["spec"]["trainer"]["env"]
        static_env = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["env"]
    # train run without --out: the job's directory on the checkpoint volume (hostile too)
    assert [expand(a) for a in args] == ["-m", "train", "run", "--out", "/ck pt/$(HOME)/'q\"/train", *values]
    env = {e["name"]: expand(e["value"]) for e in env_items if "value" in e}
    for i, value in enumerate(values):
        assert env[f"HOSTILE_{i}"] == value
    static = {e["name"]: expand(e["value"]) for e in static_env if "value" in e}
    assert static["TORCH_FR_DUMP_TEMP_FILE"] == "/ck pt/$(HOME)/'q\"/nccl_trace_rank_"
