"""The two Kubeflow operators' admission-webhook rules and the environment they inject.

Each rule and each injected variable cites the operator source it was read from, at the
versions our CRD fixtures come from (``tests/launch/crds/README.md``):

* training-operator ``v1.9.0`` (tag commit 6f74c7f6, identical to branch ``release-1.9`` at
  078ec30 for every file cited here) - ``kubeflow.org/v1`` PyTorchJob.
* kubeflow/trainer ``v2.3.0`` (tag commit 658725bd) - ``trainer.kubeflow.org/v1alpha1``.

The env functions rebuild what the operator puts into a pod from the manifest, so the runtime
contract test can run the container's command under it. They are written from the cited
lines, not imported (the operators are Go; no Go toolchain or module download here).
"""

from __future__ import annotations

import copy
import re

# ----------------------------------------------------------------------------- v1 PyTorchJob

TO = "kubeflow/training-operator@v1.9.0"
PYTORCH_CONTAINER = "pytorch"  # pkg/apis/kubeflow.org/v1/pytorch_types.go PyTorchJobDefaultContainerName
PYTORCH_PORT_NAME = "pytorchjob-port"  # pytorch_types.go PyTorchJobDefaultPortName
_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def pytorchjob_webhook_errors(job: dict) -> list[str]:
    """``validatePyTorchJob`` (pkg/webhooks/pytorch/pytorchjob_webhook.go) on create."""
    errors = []
    name = job["metadata"]["name"]
    # pytorchjob_webhook.go:80-82 NameIsDNS1035Label
    if len(name) > 63 or not _DNS1035.fullmatch(name):
        errors.append("metadata.name: not a DNS-1035 label (pytorchjob_webhook.go:80)")
    spec = job["spec"]
    # pkg/common/util/webhooks.go:15-25 ValidateRunPolicy: managedBy among supported controllers
    managed_by = spec.get("runPolicy", {}).get("managedBy")
    if managed_by not in (None, "kubeflow.org/training-operator", "kueue.x-k8s.io/multikueue"):
        errors.append("spec.runPolicy.managedBy unsupported (common/util/webhooks.go:17-22)")
    replicas = spec.get("pytorchReplicaSpecs")
    elastic = spec.get("elasticPolicy")
    if elastic is not None:
        # pytorchjob_webhook.go:96-101 elastic needs a Worker replica spec
        if "Worker" not in (replicas or {}):
            errors.append("elasticPolicy without Worker (pytorchjob_webhook.go:97-101)")
        # pytorchjob_webhook.go:102-109 nProcPerNode (deprecated) must not be used with nprocPerNode
        if "nProcPerNode" in elastic and "nprocPerNode" in spec:
            errors.append("elasticPolicy.nProcPerNode with nprocPerNode (pytorchjob_webhook.go:106-108)")
    if replicas is None:  # pytorchjob_webhook.go:118-120
        return errors + ["pytorchReplicaSpecs required (pytorchjob_webhook.go:118)"]
    for role, rspec in replicas.items():
        # pytorchjob_webhook.go:126-132 only Master and Worker
        if role not in ("Master", "Worker"):
            errors.append(f"{role}: not a PyTorchJob replica type (pytorchjob_webhook.go:130)")
        containers = rspec.get("template", {}).get("spec", {}).get("containers", [])
        if not containers:  # pytorchjob_webhook.go:134-136
            errors.append(f"{role}: containers required (pytorchjob_webhook.go:134)")
        # pytorchjob_webhook.go:140-143 every container has an image
        errors += [f"{role}: container without image (pytorchjob_webhook.go:141)" for c in containers if not c.get("image")]
        # pytorchjob_webhook.go:144-151 one container named "pytorch"
        if not any(c.get("name") == PYTORCH_CONTAINER for c in containers):
            errors.append(f"{role}: no container named pytorch (pytorchjob_webhook.go:149)")
        # pytorchjob_webhook.go:152-158 Master replicas == 1, others >= 1
        count = rspec.get("replicas")
        if role == "Master" and count != 1:
            errors.append("Master.replicas must be 1 (pytorchjob_webhook.go:153)")
        elif count is not None and count < 1:
            errors.append(f"{role}.replicas must be at least 1 (pytorchjob_webhook.go:156)")
    return errors


def _pytorch_port(job: dict, role: str) -> int:
    """envvar.go:155-168 getPortFromPyTorchJob: the pytorchjob-port of the pytorch container."""
    for container in job["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]["containers"]:
        if container["name"] == PYTORCH_CONTAINER:
            for port in container.get("ports", []):
                if port.get("name") == PYTORCH_PORT_NAME:
                    return port["containerPort"]
    raise AssertionError("port not found (envvar.go:167)")


def pytorchjob_injected_env(job: dict, role: str, index: int) -> dict[str, str]:
    """``setPodEnv`` (pkg/controller.v1/pytorch/envvar.go:43-127) for pod ``role``-``index``."""
    spec = job["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    env = {"PYTHONUNBUFFERED": "1"}  # envvar.go:56-60
    total = sum(r["replicas"] for r in replicas.values())  # envvar.go:142-148
    nproc = spec.get("nprocPerNode")
    nproc_int = int(nproc) if nproc and nproc.isdigit() else 1  # envvar.go:132-140
    if "Master" in replicas:
        # master.go:36-60: MASTER_PORT, PET_MASTER_PORT, MASTER_ADDR, PET_MASTER_ADDR
        port, addr = str(_pytorch_port(job, "Master")), f"{job['metadata']['name']}-master-0"  # envvar.go:150-153
        env.update(MASTER_PORT=port, PET_MASTER_PORT=port, MASTER_ADDR=addr, PET_MASTER_ADDR=addr)
        rank = index + 1 if role == "Worker" else index  # envvar.go:77-83
        env.update(WORLD_SIZE=str(total * nproc_int), RANK=str(rank), PET_NODE_RANK=str(rank))  # envvar.go:85-96
    if nproc is not None:
        env["PET_NPROC_PER_NODE"] = nproc  # envvar.go:99-104
    elastic = spec.get("elasticPolicy")
    if elastic is not None:
        # elastic.go:68-122 (ElasticEnvVarGenerator.Generate)
        host = elastic.get("rdzvHost") or f"{job['metadata']['name']}-worker-0"  # elastic.go:149-153
        port = elastic.get("rdzvPort") or _pytorch_port(job, "Worker")  # elastic.go:156-164
        env["PET_RDZV_ENDPOINT"] = f"{host}:{port}"
        env["PET_RDZV_BACKEND"] = elastic.get("rdzvBackend", "c10d")  # elastic.go:186-197
        if "minReplicas" in elastic or "maxReplicas" in elastic:  # elastic.go:124-143
            env["PET_NNODES"] = f"{elastic['minReplicas']}:{elastic['maxReplicas']}"
        else:
            env["PET_NNODES"] = str(replicas["Worker"]["replicas"])
        if "maxRestarts" in elastic:
            env["PET_MAX_RESTARTS"] = str(elastic["maxRestarts"])  # elastic.go:93-98
        if "rdzvId" in elastic:
            env["PET_RDZV_ID"] = elastic["rdzvId"]  # elastic.go:105-110
        if elastic.get("rdzvConf"):  # elastic.go:171-184
            env["PET_RDZV_CONF"] = ",".join(f"{c['key']}={c['value']}" for c in elastic["rdzvConf"])
    else:
        env["PET_NNODES"] = str(total)  # envvar.go:117-123
    return env


# ----------------------------------------------------------------------------- Trainer v2

TR = "kubeflow/trainer@v2.3.0"
TRAINER_CONTAINER = "node"  # pkg/constants/constants.go Node
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"  # constants.go:41
TRAINER_PORT = 29500  # constants.go:72 ContainerTrainerPort
RESERVED_ENV = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}  # constants.go:300
COMPLETION_INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"  # constants.go:297


def runtime_webhook_errors(runtime: dict) -> list[str]:
    """``validateReplicatedJobs`` (pkg/webhooks/trainingruntime_webhook.go:66-105), run for
    TrainingRuntime (:60-64) and ClusterTrainingRuntime (clustertrainingruntime_webhook.go:45-57)."""
    errors = []
    expected = {"trainer": "node", "model-initializer": "model-initializer",
                "dataset-initializer": "dataset-initializer"}  # trainingruntime_webhook.go:40-44
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        ancestor = rjob["template"].get("metadata", {}).get("labels", {}).get(ANCESTOR_LABEL)
        if ancestor not in expected:
            continue
        if rjob.get("replicas", 1) != 1:  # trainingruntime_webhook.go:79-81 (replicas defaults to 1)
            errors.append(f"{rjob['name']}: replicas must be 1 (trainingruntime_webhook.go:80)")
        names = [c["name"] for c in rjob["template"]["spec"]["template"]["spec"]["containers"]]
        if expected[ancestor] not in names:  # trainingruntime_webhook.go:88-101
            errors.append(f"{rjob['name']}: no container {expected[ancestor]!r} (trainingruntime_webhook.go:95)")
    return errors


REPLICATED_JOB_MAX_V24 = 20


def runtime_v24_errors(runtime: dict) -> list[str]:
    """Trainer v2.4.0's new rule for TrainingRuntime and ClusterTrainingRuntime, as its release notes
    state it (breaking change "limit ReplicatedJob name length to 20 characters in runtimes"):
    read, not run against v2.4.0's CRDs or webhook (the stored snapshots end at v2.3.0)."""
    return [f"replicatedJob {rjob['name']!r}: {len(rjob['name'])} characters, Trainer v2.4.0 allows "
            f"{REPLICATED_JOB_MAX_V24}" for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]
            if len(rjob["name"]) > REPLICATED_JOB_MAX_V24]


def trainjob_webhook_errors(trainjob: dict, runtime: dict) -> list[str]:
    """``TrainJobValidator.ValidateCreate`` (pkg/webhooks/trainjob_webhook.go:110-121) with the
    plugins the torch runtime enables: Torch.Validate (plugins/torch/torch.go:56-87) and
    JobSet.Validate (plugins/jobset/jobset.go:91-...)."""
    errors = []
    ref = trainjob["spec"]["runtimeRef"]
    # trainjob_webhook.go:114-118: the runtime must be a registered kind
    if (ref.get("apiGroup", "trainer.kubeflow.org"), ref.get("kind", "ClusterTrainingRuntime")) not in (
        ("trainer.kubeflow.org", "ClusterTrainingRuntime"), ("trainer.kubeflow.org", "TrainingRuntime")
    ):
        errors.append("unsupported runtime (trainjob_webhook.go:117)")
    if ref["name"] != runtime["metadata"]["name"] or ref.get("kind", "ClusterTrainingRuntime") != runtime["kind"]:
        errors.append("runtimeRef does not name this runtime")
    if runtime["kind"] == "TrainingRuntime" and runtime["metadata"].get("namespace") != trainjob["metadata"].get("namespace"):
        errors.append("a namespaced TrainingRuntime must be in the TrainJob's namespace (trainjob_types.go runtimeRef doc)")
    trainer = trainjob["spec"].get("trainer") or {}
    if "torch" in runtime["spec"]["mlPolicy"]:
        # torch.go:66-77: no torchrun-reserved env in the TrainJob
        reserved = sorted(RESERVED_ENV & {e["name"] for e in trainer.get("env", [])})
        if reserved:
            errors.append(f"reserved envs {reserved} (torch.go:76)")
    # jobset.go:112-170: initializers need their replicated jobs (we never render initializers)
    if trainjob["spec"].get("initializer"):
        errors.append("initializer without initializer jobs in the runtime (jobset.go:112-170)")
    return errors


def trainer_jobset(trainjob: dict, runtime: dict) -> dict:
    """The JobSet the trainer builds from a runtime and a TrainJob, for the parts that reach the
    pod: trainer container image/command/args/env (plugins/jobset/builder.go:113-155), resources
    merged with resourcesPerNode (core/trainingruntime.go:199-233, later keys win), node count
    into parallelism/completions (mlPolicy.numNodes overridden by trainer.numNodes,
    core/trainingruntime.go:189-195, torch.go:116-119, jobset.go:316-317) and the Torch plugin's
    PET_* variables and port (torch.go:121-203)."""
    name = trainjob["metadata"]["name"]
    spec = copy.deepcopy(runtime["spec"]["template"]["spec"])
    trainer = trainjob["spec"].get("trainer") or {}
    num_nodes = trainer.get("numNodes", runtime["spec"]["mlPolicy"].get("numNodes", 1))
    for rjob in spec["replicatedJobs"]:
        if rjob["template"].get("metadata", {}).get("labels", {}).get(ANCESTOR_LABEL) != "trainer":
            continue
        rjob["replicas"] = 1  # builder.go:123
        rjob["template"]["spec"]["parallelism"] = rjob["template"]["spec"]["completions"] = num_nodes
        for container in rjob["template"]["spec"]["template"]["spec"]["containers"]:
            if container["name"] != TRAINER_CONTAINER:
                continue
            for key in ("image", "command", "args"):  # builder.go:129-137
                if key in trainer:
                    container[key] = trainer[key]
            if "resourcesPerNode" in trainer:  # trainingruntime.go:209-233 MergeResourceRequirements
                merged = container.setdefault("resources", {})
                for part in ("limits", "requests"):
                    if part in trainer["resourcesPerNode"]:
                        merged.setdefault(part, {}).update(trainer["resourcesPerNode"][part])
            env = {e["name"]: e for e in container.get("env", [])}
            for item in trainer.get("env", []):  # builder.go:148-151 UpsertEnvVars
                env[item["name"]] = item
            nproc = str(trainer.get("numProcPerNode", "auto"))  # torch.go:121-124
            pet = [
                {"name": "PET_NNODES", "value": str(num_nodes)},  # torch.go:146-148
                {"name": "PET_NPROC_PER_NODE", "value": nproc},  # torch.go:149-151
                {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX_FIELD}}},  # :152-156
                {"name": "PET_MASTER_ADDR", "value": f"{name}-{TRAINER_CONTAINER}-0-0.{name}"},  # torch.go:160-162
                {"name": "PET_MASTER_PORT", "value": str(TRAINER_PORT)},  # torch.go:163-165
            ]
            for item in pet:  # torch.go:173-176
                env[item["name"]] = item
            container["env"] = list(env.values())
            ports = container.setdefault("ports", [])  # torch.go:203 UpsertPort
            if not any(p["containerPort"] == TRAINER_PORT for p in ports):
                ports.append({"containerPort": TRAINER_PORT})
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name, **({"namespace": trainjob["metadata"]["namespace"]}
                                          if "namespace" in trainjob["metadata"] else {})},
            "spec": spec}


# ----------------------------------------------------------------------------- JobSet

JS = "kubernetes-sigs/jobset@v0.12.0"


def jobset_webhook(jobset: dict) -> tuple[dict, list[str]]:
    """JobSet's defaulting then validating webhook on create (pkg/webhooks/jobset_webhook.go),
    for what applies to a trainer-built JobSet. Returns (defaulted JobSet, errors)."""
    js = copy.deepcopy(jobset)
    spec, errors = js["spec"], []
    spec.setdefault("successPolicy", {"operator": "All"})  # jobset_webhook.go:113-115
    spec.setdefault("startupPolicy", {"startupPolicyOrder": "AnyOrder"})  # :116-118
    for rjob in spec["replicatedJobs"]:
        rjob["template"]["spec"].setdefault("completionMode", "Indexed")  # :121-123
        rjob["template"]["spec"]["template"]["spec"].setdefault("restartPolicy", "OnFailure")  # :125-127
    network = spec.setdefault("network", {})  # :131-139
    network.setdefault("enableDNSHostnames", True)
    network.setdefault("publishNotReadyAddresses", True)
    name = js["metadata"]["name"]
    for rjob in spec["replicatedJobs"]:
        replicas = rjob.get("replicas", 1)
        if rjob["template"]["spec"].get("parallelism", 1) * replicas > 2**31 - 1:  # :219-225
            errors.append("replicas x parallelism overflow (jobset_webhook.go:224)")
        group = rjob.get("groupName", "default")
        if len(group) > 63 or not _DNS1035.fullmatch(group):  # :227-233
            errors.append(f"groupName {group!r} (jobset_webhook.go:228)")
        longest_job = f"{name}-{rjob['name']}-{replicas - 1}"  # :235-242, placement.go:14-16 GenJobName
        if len(longest_job) > 63 or not _DNS1035.fullmatch(longest_job):
            errors.append(f"job name {longest_job!r} not a DNS-1035 label (jobset_webhook.go:237)")
        completions = rjob["template"]["spec"].get("completions")
        if rjob["template"]["spec"]["completionMode"] == "Indexed" and completions is not None:
            # :243-256: placement.go:20-22 GenPodName plus the 5-character random suffix
            longest_pod = f"{name}-{rjob['name']}-{replicas - 1}-{completions - 1}-abcde"
            if len(longest_pod) > 63 or not _DNS1035.fullmatch(longest_pod):
                errors.append(f"pod name {longest_pod!r} not a DNS-1035 label (jobset_webhook.go:250)")
    return js, errors


def trainer_pod_env(container: dict, completion_index: int) -> dict[str, str]:
    """Resolve the trainer container's env the way the kubelet does for one pod of the Job:
    literal values, and PET_NODE_RANK from the pod's completion-index annotation."""
    env = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        elif item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == COMPLETION_INDEX_FIELD:
            env[item["name"]] = str(completion_index)
    return env
