"""Kubernetes manifests, checked the way the API server and the operators would check them.

Every committed file under k8s/ is a fresh render, and every committed and freshly rendered
TrainJob, ClusterTrainingRuntime/TrainingRuntime, PyTorchJob and ComputeDomain goes through:

* the real CRD (tests/launch/crds, versions in its README) with pruning (an unknown field is
  an error), defaulting, OpenAPI validation and every CEL rule (k8s_apiserver.py);
* the JobSet the trainer builds from a TrainJob and its runtime, through the JobSet CRD;
* ``kubernetes-validate --strict`` for the embedded core objects (pod templates, batch Jobs);
* the operator Python models (kubeflow-trainer-api, kubeflow SDK, kubeflow-training) without
  losing a field;
* the operators' admission-webhook rules (k8s_operators.py, each with its source line).

No cluster is involved (none can be had here).
"""

from __future__ import annotations

import functools
import json
import re
import shlex

import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml
from k8s_apiserver import admit, load_crd
from k8s_operators import (
    jobset_webhook,
    pytorchjob_injected_env,
    pytorchjob_webhook_errors,
    runtime_webhook_errors,
    trainer_jobset,
    trainjob_webhook_errors,
)
from kubeflow.trainer.backends.kubernetes import utils as sdk_utils
from kubeflow.training import ApiClient
from kubeflow_trainer_api import models as trainer_models

from launch_testlib import REPO, backend_argv, hostile_values, job_shapes, load_script, render, run_inproc

render_examples = load_script("render_examples")

pytestmark = pytest.mark.timeout(300)

# kubernetes-validate re-reads its (large) schema files on every call; the schemas are
# immutable, so memoise the file reads. Validation itself is unchanged.
if not hasattr(kubernetes_validate.utils.schema_contents, "cache_info"):
    kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(
        kubernetes_validate.utils.schema_contents
    )

K8S_VERSION = "1.33"
CRDS = {
    "TrainJob": "trainer-v2.3.0_trainer.kubeflow.org_trainjobs.yaml.gz",
    "TrainingRuntime": "trainer-v2.3.0_trainer.kubeflow.org_trainingruntimes.yaml.gz",
    "ClusterTrainingRuntime": "trainer-v2.3.0_trainer.kubeflow.org_clustertrainingruntimes.yaml.gz",
    "JobSet": "jobset-v0.12.0_jobset.x-k8s.io_jobsets.yaml.gz",
    "PyTorchJob": "training-operator-v1.9.0_kubeflow.org_pytorchjobs.yaml.gz",
    "ComputeDomain": "k8s-dra-driver-gpu-v25.12.0_resource.nvidia.com_computedomains.yaml.gz",
}
COMMITTED = sorted((REPO / "k8s").glob("*.yaml"))
RDMA_FABRICS = {"infiniband": "rdma/ib", "roce": "rdma/roce", "efa": "vpc.amazonaws.com/efa"}
RUNTIMES = ("ClusterTrainingRuntime", "TrainingRuntime")


def _docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def _render_docs(argv: list[str]) -> list[dict]:
    return _docs(render(argv))


def _one(docs: list[dict], *kinds: str) -> dict:
    found = [d for d in docs if d["kind"] in kinds]
    assert len(found) == 1, f"expected one of {kinds}, got {[d['kind'] for d in docs]}"
    return found[0]


def _committed_runtimes() -> dict[str, dict]:
    runtimes = {}
    for path in COMMITTED:
        for doc in _docs(path.read_text()):
            if doc["kind"] == "ClusterTrainingRuntime":
                runtimes[doc["metadata"]["name"]] = doc
    return runtimes


# --------------------------------------------------------------------------- server-side checks


def _admit(doc: dict) -> dict:
    """Create through the CRD: no pruned field, schema-valid, CEL rules pass; returns the stored object."""
    result = admit(doc, load_crd(CRDS[doc["kind"]]))
    result.raise_for_errors()
    return result.obj


def _validate_core(kind: str, obj: dict) -> None:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def _pod_template(name: str, template: dict) -> dict:
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": template}


def _check_pytorchjob(job: dict) -> None:
    stored = _admit(job)
    assert stored["spec"]["runPolicy"]["suspend"] is False  # the CRD's default, applied
    for role, replica in job["spec"]["pytorchReplicaSpecs"].items():
        _validate_core("PodTemplate", _pod_template(f"{job['metadata']['name']}-{role.lower()}", replica["template"]))
    assert not pytorchjob_webhook_errors(job), pytorchjob_webhook_errors(job)
    assert _sdk_roundtrip(job) == job, "a field is unknown to the kubeflow-training PyTorchJob model"
    _project_rules_pytorchjob(job)


def _check_runtime(runtime: dict) -> None:
    stored = _admit(runtime)
    assert not runtime_webhook_errors(stored), runtime_webhook_errors(stored)
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        _validate_core("PodTemplate", _pod_template(f"{runtime['metadata']['name']}-{rjob['name']}",
                                                    rjob["template"]["spec"]["template"]))
    cls = getattr(trainer_models, f"TrainerV1alpha1{runtime['kind']}")
    assert cls.from_dict(runtime).to_dict() == runtime, "a field is unknown to kubeflow-trainer-api"
    model = cls.from_dict(runtime)
    trainer = sdk_utils.get_runtime_trainer(
        model.metadata.labels["trainer.kubeflow.org/framework"],
        model.spec.template.spec.replicated_jobs,
        model.spec.ml_policy,
    )  # what the kubeflow SDK (TrainerClient.get_runtime) derives from the runtime
    assert trainer.framework == "torch" and trainer.device == "gpu" and int(trainer.device_count) >= 1
    assert trainer.image


def _check_trainjob(trainjob: dict, runtime: dict) -> None:
    stored = _admit(trainjob)
    assert stored["spec"]["managedBy"] == "trainer.kubeflow.org/trainjob-controller"  # CRD default
    assert stored["spec"]["suspend"] is False
    assert not trainjob_webhook_errors(stored, runtime), trainjob_webhook_errors(stored, runtime)
    model = trainer_models.TrainerV1alpha1TrainJob.from_dict(trainjob)
    assert model.to_dict() == trainjob, "a field is unknown to kubeflow-trainer-api"
    jobset = trainer_jobset(stored, admit(runtime, load_crd(CRDS[runtime["kind"]])).obj)
    jobset, errors = jobset_webhook(jobset)  # JobSet's own defaulting + validating webhook
    assert not errors, errors
    _admit(jobset)  # the JobSet the trainer would create, through the JobSet CRD
    for rjob in jobset["spec"]["replicatedJobs"]:
        _validate_core("Job", {"apiVersion": "batch/v1", "kind": "Job",
                               "metadata": {"name": f"{jobset['metadata']['name']}-{rjob['name']}-0"},
                               "spec": rjob["template"]["spec"]})
    _project_rules_trainer(trainjob, runtime, jobset)


def _check_compute_domain(domain: dict, pod_specs: list[dict]) -> None:
    stored = _admit(domain)
    assert stored["spec"]["channel"]["allocationMode"] == "Single"  # CRD default, applied
    template = domain["spec"]["channel"]["resourceClaimTemplate"]["name"]
    for pod in pod_specs:
        claims = {c["name"]: c["resourceClaimTemplateName"] for c in pod["resourceClaims"]}
        assert template in claims.values()
        for container in pod["containers"]:
            assert {c["name"] for c in container["resources"]["claims"]} <= set(claims)
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert env["NCCL_MNNVL_ENABLE"] == "1"
        term = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        assert term["topologyKey"] == "nvidia.com/gpu.clique"


def check_manifests(docs: list[dict], runtimes: dict[str, dict] | None = None) -> None:
    """Everything above for one rendered file (a TrainJob may need a runtime from elsewhere)."""
    kinds = [d["kind"] for d in docs]
    pods = []
    for doc in docs:
        if doc["kind"] == "PyTorchJob":
            _check_pytorchjob(doc)
            pods += [r["template"]["spec"] for r in doc["spec"]["pytorchReplicaSpecs"].values()]
        elif doc["kind"] in RUNTIMES:
            _check_runtime(doc)
            pods += [r["template"]["spec"]["template"]["spec"] for r in doc["spec"]["template"]["spec"]["replicatedJobs"]]
        elif doc["kind"] == "TrainJob":
            ref = doc["spec"]["runtimeRef"]
            runtime = next((d for d in docs if d["kind"] == ref["kind"]), None) or (runtimes or {}).get(ref["name"])
            assert runtime is not None, f"TrainJob refers to {ref['kind']} {ref['name']}, which is not rendered"
            _check_trainjob(doc, runtime)
        elif doc["kind"] != "ComputeDomain":
            raise AssertionError(f"unexpected kind {doc['kind']}")
    if "ComputeDomain" in kinds:
        _check_compute_domain(_one(docs, "ComputeDomain"), pods)
    else:
        for pod in pods:
            assert "resourceClaims" not in pod and "affinity" not in pod
            assert "NCCL_MNNVL_ENABLE" not in {e["name"] for e in pod["containers"][0].get("env", [])}


def _sdk_roundtrip(job: dict) -> dict:
    class Response:
        data = json.dumps(job)

    client = ApiClient()
    model = client.deserialize(Response(), "KubeflowOrgV1PyTorchJob")
    assert type(model).__name__ == "KubeflowOrgV1PyTorchJob"
    return client.sanitize_for_serialization(model)


# --------------------------------------------------------------------------- project rules


def _project_pod_rules(pod: dict, container: dict) -> None:
    assert pod["terminationGracePeriodSeconds"] >= 60
    security = container["securityContext"]
    assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False
    assert not pod.get("hostNetwork") and not pod.get("hostIPC") and not pod.get("hostPID")
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["nodeSelector"]["kubernetes.io/arch"] in ("amd64", "arm64")
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory" and volumes["dshm"]["emptyDir"]["sizeLimit"]
    assert volumes["checkpoints"]["persistentVolumeClaim"]["claimName"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["dshm"] == "/dev/shm" and mounts["checkpoints"].startswith("/")
    assert container["command"] == ["torchrun"]
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert env.get("NCCL_NVLS_ENABLE", "0") == "0"
    for name in env:
        assert not (name.startswith("PET_") or name in ("MASTER_ADDR", "RANK", "WORLD_SIZE")), (
            "the operator owns the rendezvous variables"
        )


def _project_rules_pytorchjob(job: dict) -> None:
    name, nproc = job["metadata"]["name"], job["spec"]["nprocPerNode"]
    for role, replica in job["spec"]["pytorchReplicaSpecs"].items():
        for index in range(replica["replicas"]):
            assert len(f"{name}-{role.lower()}-{index}") <= 63  # the operator's Service names
        pod = replica["template"]["spec"]
        (container,) = [c for c in pod["containers"] if c["name"] == "pytorch"]
        _project_pod_rules(pod, container)
        assert container["ports"][0]["name"] == "pytorchjob-port"
        limits = container["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == nproc == container["resources"]["requests"]["nvidia.com/gpu"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"


def _project_rules_trainer(trainjob: dict, runtime: dict, jobset: dict) -> None:
    trainer = trainjob["spec"]["trainer"]
    assert set(trainer) <= {"image", "args", "numNodes", "numProcPerNode", "env", "resourcesPerNode"}, (
        "a TrainJob sets only what is per job"
    )
    assert "command" not in trainer  # the runtime's torchrun
    assert runtime["metadata"]["labels"]["trainer.kubeflow.org/framework"] == "torch"
    (rjob,) = jobset["spec"]["replicatedJobs"]
    assert rjob["template"]["spec"]["parallelism"] == trainer["numNodes"]
    pod = rjob["template"]["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "node"]
    runtime_container = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    _project_pod_rules(pod, {**container, "env": runtime_container.get("env", [])})
    assert container["resources"]["limits"]["nvidia.com/gpu"] == str(trainer["numProcPerNode"])
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
    assert env["PET_NPROC_PER_NODE"] == str(trainer["numProcPerNode"])


# --------------------------------------------------------------------------- committed files


def test_required_committed_manifests_exist():
    names = {p.name for p in COMMITTED}
    assert {"trainjob-h100-1x8.yaml", "runtime-h100-nvlink.yaml", "pytorchjob-h100-2x8-infiniband.yaml",
            "pytorchjob-h100-elastic-1to4-infiniband.yaml", "trainjob-gb200-nvl72-2x4.yaml",
            "trainjob-gb200-1x4.yaml"} <= names
    kinds = {d["kind"] for p in COMMITTED for d in _docs(p.read_text())}
    assert kinds == {"TrainJob", "ClusterTrainingRuntime", "TrainingRuntime", "PyTorchJob", "ComputeDomain"}


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name)
def test_committed_manifest_is_a_fresh_render(path):
    text = path.read_text()
    first = text.splitlines()[0]
    assert first.startswith("# Generated by: launch k8s")
    argv = shlex.split(first[len("# Generated by: launch "):])
    assert render(argv) == text, f"{path.name} is stale: run `python scripts/render_examples.py`"


def test_examples_table_covers_committed_files_and_check_mode():
    listed = {path for path, *_ in render_examples.EXAMPLES}
    assert {f"k8s/{p.name}" for p in COMMITTED} <= listed
    assert render_examples.main(["--check", "--root", str(REPO)]) == 0


def test_readme_documents_every_command():
    readme = (REPO / "k8s" / "README.md").read_text()
    assert "python scripts/render_examples.py" in readme
    for path in COMMITTED:
        assert path.name in readme


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name)
def test_committed_manifest_passes_the_api_server_and_operator_checks(path):
    check_manifests(_docs(path.read_text()), _committed_runtimes())


def test_committed_trainjobs_name_committed_runtimes():
    runtimes = _committed_runtimes()
    for path in COMMITTED:
        for doc in _docs(path.read_text()):
            if doc["kind"] == "TrainJob" and doc["spec"]["runtimeRef"]["kind"] == "ClusterTrainingRuntime":
                assert doc["spec"]["runtimeRef"]["name"] in runtimes, path.name


# --------------------------------------------------------------------------- fresh renders


def _fixed_shapes():
    return [(i, o) for i, o in job_shapes() if "elastic" not in i]


def test_every_shape_renders_valid_trainjobs_and_runtimes():
    for shape_id, options in _fixed_shapes():
        try:
            job_docs = _render_docs(backend_argv("k8s", ["--api", "trainjob", *options]))
            runtimes = {}
            if "ComputeDomain" not in {d["kind"] for d in job_docs}:
                (runtime,) = _render_docs(backend_argv("k8s-runtime", options))
                runtimes[runtime["metadata"]["name"]] = runtime
                check_manifests([runtime])
            check_manifests(job_docs, runtimes)
        except Exception as exc:  # pragma: no cover - report which shape failed
            raise AssertionError(f"{shape_id}: {exc}") from exc


def test_every_shape_renders_a_valid_pytorchjob():
    for shape_id, options in job_shapes():
        try:
            check_manifests(_render_docs(backend_argv("k8s", ["--api", "pytorchjob", *options])))
        except Exception as exc:  # pragma: no cover
            raise AssertionError(f"{shape_id}: {exc}") from exc


def test_pruned_fields_defaults_and_cel_rules_are_enforced():
    """The checker itself: what a server would prune, reject or default is caught."""
    (job,) = _render_docs(["k8s", "--profile", "h100"])
    job["spec"]["trainer"]["numNode"] = 2  # typo: a server prunes it silently
    errors = admit(job, load_crd(CRDS["TrainJob"])).errors
    assert errors == ["spec.trainer.numNode: unknown field, pruned by the API server"]
    (job,) = _render_docs(["k8s", "--profile", "h100", "--name", "x" * 40])
    job["metadata"]["name"] = "x" * 64  # CEL: size(self.metadata.name) <= 63
    assert any("CEL: size(self.metadata.name) <= 63" in e for e in admit(job, load_crd(CRDS["TrainJob"])).errors)
    (runtime,) = _render_docs(["k8s-runtime", "--profile", "h100"])
    runtime["spec"]["mlPolicy"]["mpi"] = {}  # CEL: only one ML policy
    assert any("Only one of the policy" in e for e in admit(runtime, load_crd(CRDS["ClusterTrainingRuntime"])).errors)
    stored = admit(_render_docs(["k8s-runtime", "--profile", "h100"])[0], load_crd(CRDS["ClusterTrainingRuntime"]))
    assert stored.cel_rules_run >= 2 and "spec.template.spec.failurePolicy.restartStrategy" in stored.defaulted
    assert stored.obj["spec"]["template"]["spec"]["failurePolicy"]["restartStrategy"] == "Recreate"


# --------------------------------------------------------------------------- behaviour


def test_api_choice_and_elastic_needs_pytorchjob():
    assert _render_docs(["k8s", "--profile", "h100"])[0]["kind"] == "TrainJob"
    elastic = _render_docs(["k8s", "--profile", "h100", "--nnodes", "1:4", "--fabric", "infiniband"])
    assert [d["kind"] for d in elastic] == ["PyTorchJob"]
    rc, _, err = run_inproc(["k8s", "--api", "trainjob", "--nnodes", "1:4", "--fabric", "infiniband"])
    assert rc == 2 and "Trainer v2 (TrainJob) has no elastic mode" in err and "--api pytorchjob" in err
    rc, _, err = run_inproc(["k8s-runtime", "--nnodes", "1:4", "--fabric", "infiniband"])
    assert rc == 2 and "no elastic mode" in err


def test_replica_layout():
    (single,) = _render_docs(["k8s", "--api", "pytorchjob", "--profile", "h100"])
    assert list(single["spec"]["pytorchReplicaSpecs"]) == ["Master"] and "elasticPolicy" not in single["spec"]
    (multi,) = _render_docs(["k8s", "--api", "pytorchjob", "--profile", "h100", "--nnodes", "3", "--fabric", "infiniband"])
    assert {r: s["replicas"] for r, s in multi["spec"]["pytorchReplicaSpecs"].items()} == {"Master": 1, "Worker": 2}
    (elastic,) = _render_docs(["k8s", "--profile", "h100", "--nnodes", "1:4", "--fabric", "infiniband", "--gang"])
    assert {r: s["replicas"] for r, s in elastic["spec"]["pytorchReplicaSpecs"].items()} == {"Worker": 4}
    policy = elastic["spec"]["elasticPolicy"]
    assert (policy["minReplicas"], policy["maxReplicas"], policy["maxRestarts"]) == (1, 4, 3)
    assert elastic["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 1}
    (trainjob,) = _render_docs(["k8s", "--profile", "h100", "--nnodes", "3", "--fabric", "infiniband"])
    assert trainjob["spec"]["trainer"]["numNodes"] == 3 and trainjob["spec"]["trainer"]["numProcPerNode"] == 8


def test_runtime_carries_profile_and_fabric_trainjob_only_per_job_things():
    options = ["--profile", "h100", "--nnodes", "2", "--fabric", "infiniband", "--gang", "--grace-period", "600",
               "--node-selector", "pool=a100", "--image-pull-secret", "regcred", "--shm-size", "32Gi"]
    (runtime,) = _render_docs(["k8s-runtime", *options])
    (trainjob,) = _render_docs(["k8s", *options, "--queue", "team-a", "--image", "img:1", "--cpus", "64",
                                "--env", "MY_FLAG=1", "--", "--config", "tiny"])
    assert trainjob["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                                              "name": runtime["metadata"]["name"]}
    assert runtime["spec"]["podGroupPolicy"] == {"coscheduling": {"scheduleTimeoutSeconds": 300}}
    pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["terminationGracePeriodSeconds"] == 600 and pod["nodeSelector"]["pool"] == "a100"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert container["resources"]["limits"]["rdma/ib"] == "1" and container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert {e["name"]: e["value"] for e in container["env"]}["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "570"
    assert trainjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert trainjob["spec"]["trainer"]["image"] == "img:1"
    assert trainjob["spec"]["trainer"]["env"] == [{"name": "MY_FLAG", "value": "1"}]
    assert trainjob["spec"]["trainer"]["resourcesPerNode"]["limits"] == {"nvidia.com/gpu": "8", "cpu": "64"}
    check_manifests([runtime])
    check_manifests([trainjob], {runtime["metadata"]["name"]: runtime})


def test_runtime_name_follows_the_runtime_content():
    def name(*extra):
        return _render_docs(["k8s-runtime", "--profile", "h100", *extra])[0]["metadata"]["name"]

    def ref(*extra):
        return _render_docs(["k8s", "--profile", "h100", *extra])[0]["spec"]["runtimeRef"]["name"]

    assert name() == ref() == ref("--image", "other:1", "--env", "X=1", "--", "--steps", "3") == name("--image", "o:2")
    assert name().startswith("h100-nvlink-")
    assert name("--gang") != name() and ref("--gang") == name("--gang")
    assert name("--shm-size", "8Gi") != name() and name("--runtime", "mine") == "mine" == ref("--runtime", "mine")


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
        docs = _render_docs(argv)
        assert "ComputeDomain" not in {d["kind"] for d in docs}
        assert "NCCL_MNNVL_ENABLE" not in render(argv) and "resourceClaims" not in render(argv)
    # the bare-metal backends leave MNNVL to NCCL's auto-detection (no IMEX domain is rendered)
    for backend in ("env", "torchrun", "slurm"):
        assert "NCCL_MNNVL_ENABLE" not in render([backend, "--profile", "gb200", "--nnodes", "2", "--rdzv-endpoint", "n0"])


@pytest.mark.parametrize("api", ["trainjob", "pytorchjob"])
def test_gb200_multi_node_gets_a_compute_domain(api):
    docs = _render_docs(["k8s", "--api", api, "--profile", "gb200", "--nnodes", "2", "--name", "nvl", "--namespace", "ml"])
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
    elastic = _render_docs(["k8s", "--profile", "gb200", "--nnodes", "2:4", "--fabric", "efa",
                            "--rdma-resource", "vpc.amazonaws.com/efa=8"])
    assert elastic[0]["spec"]["numNodes"] == 0  # node count not fixed (driver >= 25.8 default mode)
    check_manifests(elastic)
    off = _render_docs(["k8s", "--api", api, "--profile", "gb200", "--nnodes", "2", "--no-compute-domain"])
    assert "ComputeDomain" not in {d["kind"] for d in off}


def test_k8s_options():
    docs = _render_docs([
        "k8s", "--api", "pytorchjob", "--profile", "gb200", "--nnodes", "2", "--fabric", "roce", "--ib-hca",
        "=mlx5_0", "--name", "opts", "--namespace", "ml", "--queue", "team-a", "--pvc", "ckpt-claim",
        "--shm-size", "128Gi", "--grace-period", "900", "--image-pull-secret", "regcred",
        "--node-selector", "nvidia.com/gpu.clique=abc.1", "--pod-annotation",
        "k8s.v1.cni.cncf.io/networks=roce-net", "--rdma-resource", "rdma/rdma_shared_device_a=2",
        "--env-secret", "HF_TOKEN=hf-secret:token", "--cpus", "64", "--memory", "512Gi",
    ])
    check_manifests(docs)
    job = _one(docs, "PyTorchJob")
    assert job["metadata"]["namespace"] == "ml"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert "kueue.x-k8s.io/queue-name" not in _one(docs, "ComputeDomain")["metadata"]["labels"]
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
    (job,) = _render_docs(["k8s", "--name", longest_ok, "--nnodes", "12", "--fabric", "infiniband"])
    (runtime,) = _render_docs(["k8s-runtime", "--nnodes", "12", "--fabric", "infiniband"])
    check_manifests([job], {runtime["metadata"]["name"]: runtime})
    rc, _, err = run_inproc(["k8s", "--name", longest_ok + "a", "--nnodes", "12", "--fabric", "infiniband"])
    assert rc == 2 and "exceed 63" in err
    assert jobset_webhook(trainer_jobset(
        {**job, "metadata": {**job["metadata"], "name": longest_ok + "a"}}, runtime))[1]


def test_operator_rules_reject_what_the_operators_reject():
    """The written-down webhook rules are not vacuous: each one rejects its violation."""
    (pj,) = _render_docs(["k8s", "--api", "pytorchjob", "--profile", "h100", "--nnodes", "2", "--fabric", "infiniband"])
    bad = json.loads(json.dumps(pj))
    bad["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    bad["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] = "main"
    bad["spec"]["pytorchReplicaSpecs"]["Chief"] = bad["spec"]["pytorchReplicaSpecs"]["Worker"]
    errors = pytorchjob_webhook_errors(bad)
    assert any("Master.replicas" in e for e in errors) and any("no container named pytorch" in e for e in errors)
    assert any("Chief" in e for e in errors)
    (runtime,) = _render_docs(["k8s-runtime", "--profile", "h100"])
    bad = json.loads(json.dumps(runtime))
    bad["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["name"] = "trainer"
    assert runtime_webhook_errors(bad) and not runtime_webhook_errors(runtime)
    (job,) = _render_docs(["k8s", "--profile", "h100"])
    job["spec"]["trainer"]["env"] = [{"name": "PET_NNODES", "value": "3"}]
    assert any("reserved envs" in e for e in trainjob_webhook_errors(job, runtime))
    # the injected environment: a 3-node fixed PyTorchJob, worker 1 is node rank 2
    (pj,) = _render_docs(["k8s", "--api", "pytorchjob", "--profile", "h100", "--nnodes", "3", "--fabric", "infiniband"])
    env = pytorchjob_injected_env(pj, "Worker", 1)
    assert (env["PET_NODE_RANK"], env["PET_NNODES"], env["WORLD_SIZE"], env["PET_NPROC_PER_NODE"]) == ("2", "3", "24", "8")


@pytest.mark.parametrize("api", ["trainjob", "pytorchjob"])
def test_hostile_values_survive_yaml_and_kubernetes_expansion(tmp_path, api):
    values = hostile_values(tmp_path / "CANARY")
    argv = ["k8s", "--api", api, "--profile", "h100", "--checkpoint-dir", "/ck pt/$(HOME)/'q\"", "--flight-recorder"]
    for i, value in enumerate(values):
        argv += ["--env", f"HOSTILE_{i}={value}"]
    docs = _render_docs([*argv, "--", *values])
    runtime_argv = [a if a != "trainjob" else "pytorchjob" for a in argv]  # same options, runtime side
    runtimes = {}
    if api == "trainjob":
        (runtime,) = _render_docs(["k8s-runtime", *runtime_argv[3:]])
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
        args, env_items = docs[0]["spec"]["trainer"]["args"], docs[0]["spec"]["trainer"]["env"]
        static_env = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [expand(a) for a in args] == ["-m", "train", "run", *values]
    env = {e["name"]: expand(e["value"]) for e in env_items if "value" in e}
    for i, value in enumerate(values):
        assert env[f"HOSTILE_{i}"] == value
    static = {e["name"]: expand(e["value"]) for e in static_env if "value" in e}
    assert static["TORCH_FR_DUMP_TEMP_FILE"] == "/ck pt/$(HOME)/'q\"/nccl_trace_rank_"
