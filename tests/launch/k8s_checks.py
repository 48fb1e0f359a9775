"""The checks of tests/launch/test_launch_k8s*.py: a rendered manifest goes through what the
API server and the operators would do with it (see test_launch_k8s.py's docstring), then the
project's own rules. Helpers only: no tests here."""

from __future__ import annotations

import functools
import json

import kubernetes_validate
import kubernetes_validate.utils
import yaml
from kubeflow.trainer.backends.kubernetes import utils as sdk_utils
from kubeflow.training import ApiClient
from kubeflow_trainer_api import models as trainer_models

from k8s_apiserver import admit, load_crd
from k8s_operators import (
    jobset_webhook,
    pytorchjob_webhook_errors,
    runtime_v24_errors,
    runtime_webhook_errors,
    trainer_jobset,
    trainjob_webhook_errors,
)
from launch_testlib import REPO, render

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


def manifest_docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def render_docs(argv: list[str]) -> list[dict]:
    return manifest_docs(render(argv))


def one_kind(docs: list[dict], *kinds: str) -> dict:
    found = [d for d in docs if d["kind"] in kinds]
    assert len(found) == 1, f"expected one of {kinds}, got {[d['kind'] for d in docs]}"
    return found[0]


def committed_runtimes() -> dict[str, dict]:
    runtimes = {}
    for path in COMMITTED:
        for doc in manifest_docs(path.read_text()):
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
    assert not runtime_v24_errors(stored), runtime_v24_errors(stored)
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
            runtime = next((d for d in docs if d["kind"] == ref["kind"] and d["metadata"]["name"] == ref["name"]),
                           None) or (runtimes or {}).get(ref["name"])
            assert runtime is not None, f"TrainJob refers to {ref['kind']} {ref['name']}, which is not rendered"
            _check_trainjob(doc, runtime)
        elif doc["kind"] != "ComputeDomain":
            raise AssertionError(f"unexpected kind {doc['kind']}")
    if "ComputeDomain" in kinds:
        _check_compute_domain(one_kind(docs, "ComputeDomain"), pods)
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
