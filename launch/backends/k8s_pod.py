"""Kubernetes manifests for the job: Kubeflow Trainer v2 and training-operator v1.

Two APIs, one pod template (``templates/_k8s_pod.yaml.j2``, its context built here):

* ``trainer.kubeflow.org/v1alpha1`` (Kubeflow Trainer v2, checked against v2.3.0), the default
  for fixed-size jobs. ``launch k8s-runtime`` renders a ``ClusterTrainingRuntime`` holding what
  the profile and fabric need (NCCL environment, /dev/shm, RDMA, IPC_LOCK, grace period, node
  selection, gang scheduling; ``backends/runtime.py``); ``launch k8s --api trainjob`` renders a
  ``TrainJob`` that refers to it and sets only image, arguments, node count and resources
  (``backends/trainjob.py``). The Torch plugin injects ``PET_NNODES``, ``PET_NPROC_PER_NODE``,
  ``PET_NODE_RANK`` and ``PET_MASTER_ADDR/PORT`` into the container named ``node``
  (kubeflow/trainer ``pkg/runtime/framework/plugins/torch/torch.go``). Trainer v2 has no
  elastic mode, so ``--nnodes MIN:MAX`` needs ``--api pytorchjob``.
* ``kubeflow.org/v1`` ``PyTorchJob`` (training-operator >= 1.8, checked against v1.9;
  ``backends/pytorchjob.py``): for elastic jobs and clusters still on v1.
  ``spec.nprocPerNode`` becomes ``PET_NPROC_PER_NODE``; fixed size is ``Master`` (1) +
  ``Worker`` (N-1) with ``PET_MASTER_ADDR/PORT``, ``PET_NNODES``, ``PET_NODE_RANK``; elastic is
  ``Worker`` only with ``PET_RDZV_ENDPOINT`` (worker-0), ``PET_NNODES=MIN:MAX``,
  ``PET_MAX_RESTARTS`` (``pkg/controller.v1/pytorch/envvar.go``, ``master.go``, ``elastic.go``).

Multi-node jobs on a profile with multi-node NVLink (GB200 NVL72) get a ``ComputeDomain`` of the
NVIDIA DRA driver, its IMEX channel as a pod resource claim, pod affinity on the
``nvidia.com/gpu.clique`` node label, and the profile's ``compute_domain`` environment
(``NCCL_MNNVL_ENABLE=1``); single-tray jobs get none of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from core.errors import SpecError
from core.safety import excerpt
from launch.backends.k8s_options import GPU_RESOURCE, LABEL_VALUE, K8sOptions, parse_key_value, qualified_name
from launch.commandline import preflight_train_args
from launch.envnames import check_unique_env
from launch.envplan import EnvPlan
from launch.render import sh, shwords
from launch.spec import JobSpec, parse_quantity

GANG_TIMEOUT_S = 300
CLAIM_NAME = "imex-channel"

# Template contexts are dataclasses (not dicts): templates reach their fields by name, and the
# quoting tests replace every string value in them, dict keys included.


@dataclass(frozen=True)
class ComputeDomain:
    name: str
    template: str  # the ResourceClaimTemplate the DRA driver creates for the channel
    claim: str  # the pod's resourceClaims entry
    num_nodes: int
    labels: dict


@dataclass(frozen=True)
class Resource:
    """One entry of the container's resources: always a request, and a limit where ``limit``."""

    name: str
    quantity: str
    why: str | None  # a comment next to the entry
    limit: bool = True


@dataclass(frozen=True)
class Port:
    name: str
    number: int


@dataclass(frozen=True)
class Pod:
    labels: dict
    selector_name: str | None  # app.kubernetes.io/name value for the NVLink-domain affinity
    annotations: dict
    restart_policy: str | None
    grace: int
    image_pull_secrets: tuple
    node_selector: dict
    compute_domain: ComputeDomain | None
    container: str
    image: str
    pull_policy: str  # IfNotPresent; Never for --image-preloaded
    args: tuple | None
    port: Port | None
    env: tuple
    secret_env: tuple
    resources: tuple  # Resource entries
    ipc_lock: bool
    checkpoint_dir: str
    shm_size: str
    pvc: str
    pvc_access_mode: str  # as declared with --pvc-access-mode (a comment; checked by check_checkpoint_claim)
    preflight: str | None = None  # --preflight: the container's `bash -c` wrapper (preflight_script)


@dataclass(frozen=True)
class Runtime:
    kind: str
    name: str


@dataclass(frozen=True)
class Gang:
    timeout: int


def uses_compute_domain(spec: JobSpec, opts: K8sOptions) -> bool:
    """A ComputeDomain (IMEX channels) only for multi-node jobs on multi-node NVLink hardware."""
    return bool(spec.profile.compute_domain_env) and spec.nodes.multi_node and opts.compute_domain


def compute_domain(spec: JobSpec, opts: K8sOptions) -> ComputeDomain | None:
    if not uses_compute_domain(spec, opts):
        return None
    labels = {k: v for k, v in job_labels(spec, opts).items() if k != "kueue.x-k8s.io/queue-name"}
    return ComputeDomain(
        name=f"{spec.name}-imex",
        template=f"{spec.name}-imex-channel",
        claim=CLAIM_NAME,
        num_nodes=0 if spec.nodes.elastic else spec.nodes.max,
        labels=labels,
    )


def job_labels(spec: JobSpec, opts: K8sOptions) -> dict:
    labels = {"app.kubernetes.io/name": spec.name, "app.kubernetes.io/managed-by": "launch"}
    if opts.queue:
        labels["kueue.x-k8s.io/queue-name"] = opts.queue
    return labels


def _node_selector(spec: JobSpec, opts: K8sOptions) -> dict:
    node_selector = {"kubernetes.io/arch": spec.profile.cpu_arch, "nvidia.com/gpu.present": "true"}
    where = f"profile {spec.profile.name!r} k8s.node_selector"  # the same rule as --node-selector
    node_selector.update(parse_key_value(where, f"{k}={v}", LABEL_VALUE) for k, v in spec.profile.node_selector)
    node_selector.update(dict(opts.node_selector))
    return node_selector


def _rdma(spec: JobSpec, opts: K8sOptions) -> tuple[str, int, str] | None:
    fabric = spec.fabric.rdma_resource
    if fabric is None and opts.rdma_resource is None:
        return None
    name = opts.rdma_resource[0] if opts.rdma_resource else fabric.name
    if not qualified_name(name):  # a fabric YAML's name: the same rule as --rdma-resource
        raise SpecError(f"fabric {spec.fabric.name!r} k8s.rdma_resource.name {excerpt(name)}: not a valid "
                        "Kubernetes resource name (NAME of at most 63 characters, DOMAIN of at most 253)")
    count = (opts.rdma_resource[1] if opts.rdma_resource else None) or (fabric.count if fabric else None)
    if count is None:
        raise SpecError(
            f"fabric {spec.fabric.name!r} needs the RDMA resource count for this cluster: "
            f"--rdma-resource {name}=COUNT" + (f" ({fabric.why})" if fabric else "")
        )
    why = fabric.why if fabric else "--rdma-resource"
    return name, count, why


def pod(spec: JobSpec, plan: EnvPlan, opts: K8sOptions, *, gpus: int, **fields) -> Pod:
    """The pod template every API shares; ``fields`` fill in what differs per API."""
    check_checkpoint_claim(spec, opts)
    rdma = _rdma(spec, opts)
    resources = [Resource(GPU_RESOURCE, str(gpus), None), *cpu_memory(spec)]
    if rdma:
        if rdma[0] in {r.name for r in resources}:  # a map key twice: the API keeps one silently
            source = "--rdma-resource" if opts.rdma_resource else f"fabric {spec.fabric.name!r} k8s.rdma_resource.name"
            raise SpecError(f"{source} {excerpt(rdma[0])}: the pod requests this resource already")
        resources.insert(1, Resource(rdma[0], str(rdma[1]), rdma[2]))
    domain = fields.get("compute_domain")
    values = {
        "annotations": dict(opts.pod_annotations),
        "restart_policy": None,
        "grace": spec.grace_period_s,
        "image_pull_secrets": opts.image_pull_secrets,
        "node_selector": _node_selector(spec, opts),
        "compute_domain": None,
        "port": None,
        "env": plan.variables,
        "secret_env": (),
        "pull_policy": "Never" if spec.image_preloaded else "IfNotPresent",
        "resources": tuple(resources),
        "ipc_lock": spec.fabric.ipc_lock,
        "checkpoint_dir": spec.checkpoint_dir,
        "shm_size": opts.shm_size,
        "pvc": opts.pvc,
        "pvc_access_mode": opts.pvc_access_mode,
        "selector_name": spec.name if domain else None,
    }
    values.update(fields)
    return Pod(**values)


# etcd keeps an object of at most 1.5 MiB (its default --max-request-bytes); the operator adds
# status and fields of its own: launch keeps each rendered object under 1 MiB.
MANIFEST_MAX_BYTES = 1 << 20


def check_manifest_size(text: str) -> str:
    """``text`` (YAML documents; every value is quoted on one line, so a line ``---`` only ever
    separates documents) with no object over MANIFEST_MAX_BYTES."""
    for doc in re.split(r"(?m)^---$", text):
        size = len(doc.encode("utf-8"))
        if size > MANIFEST_MAX_BYTES:
            kind = re.search(r"(?m)^kind: (\S+)$", doc)
            raise SpecError(f"the rendered {kind.group(1) if kind else 'manifest'} is {size} bytes; Kubernetes keeps "
                            f"objects of at most 1.5 MiB (etcd) and launch stays under {MANIFEST_MAX_BYTES}: "
                            "shorten --env values or the training arguments")
    return text


CPU_WHY = ("request only: a CPU limit is a CFS quota, which throttles the data-loader and NCCL proxy "
           "threads in bursts")
MEMORY_WHY = "the limit equals the request: a pod above its memory request is the first evicted under pressure"


def cpu_memory(spec: JobSpec, *, profile: bool = True) -> list[Resource]:
    """The trainer pod's CPU request and memory request and limit: --cpus / --memory, else (with
    ``profile``) the profile's ``k8s.resources``; without ``profile`` only what the user gave (a
    TrainJob's resourcesPerNode, merged over its runtime's)."""
    if spec.resources.cpus is not None:
        parse_quantity("--cpus", spec.resources.cpus)
    if spec.resources.memory == "0":
        raise SpecError("--memory 0 is Slurm's 'all of the node's memory'; a Kubernetes pod needs a quantity "
                        "such as 512Gi")
    given = {"cpu": (spec.resources.cpus, "--cpus"), "memory": (spec.resources.memory, "--memory")}
    out = []
    for key, value, why in (spec.profile.k8s_resources if profile else ()):
        if given[key][0] is None:
            where = f"profile {spec.profile.name!r} k8s.resources.{key}"
            given[key] = (parse_quantity(where, value), f"profile {spec.profile.name}: {why}")
    for key, (value, source) in given.items():
        if value is not None:
            limit = key == "memory"
            out.append(Resource(key, value, f"{source}; {MEMORY_WHY if limit else CPU_WHY}", limit=limit))
    return out


def check_checkpoint_claim(spec: JobSpec, opts: K8sOptions) -> None:
    """The checkpoint claim's access mode (as the user declares it: launch does not see the claim)
    against the job: the trainer writes to it, and every node of a multi-node job mounts it."""
    mode, claim = opts.pvc_access_mode, opts.pvc
    if mode == "ReadOnlyMany":
        raise SpecError(f"--pvc-access-mode ReadOnlyMany: the trainer writes its checkpoints to claim {claim!r} "
                        f"(--checkpoint-dir {spec.checkpoint_dir}); it needs a writable claim")
    if spec.nodes.multi_node and mode in ("ReadWriteOnce", "ReadWriteOncePod"):
        one = "one pod" if mode == "ReadWriteOncePod" else "one node"
        raise SpecError(f"--pvc-access-mode {mode} with --nnodes {spec.nodes.torchrun_value}: claim {claim!r} mounts "
                        f"on {one} only and every node of the job mounts it; use a ReadWriteMany claim")


def check_unique_pod_env(plan: EnvPlan, opts: K8sOptions) -> None:
    # a Secret-backed variable next to a plain one of the same name: which wins is up to
    # the API server's merge; refuse instead
    check_unique_env([*(v.name for v in plan.variables), *(s.name for s in opts.secret_env)])


def refuse_preflight(spec: JobSpec) -> None:
    if spec.preflight.enabled:
        raise SpecError("--preflight: rendered for --api pytorchjob only so far (a TrainJob's command "
                        "comes from its runtime)")


def preflight_script(spec: JobSpec) -> str | None:
    """--preflight in a pod: ``bash -c SCRIPT launch-preflight TRAIN_ARGS...`` runs ``train
    preflight`` through torchrun (the operator's PET_* variables give it the nodes) on the
    rendezvous port + 1, then execs the training torchrun with the pod's args."""
    if not spec.preflight.enabled:
        return None
    check = shwords(preflight_train_args(spec))
    rid = sh(f"{spec.rdzv.id}-preflight")
    # the operator's PET_* values reach $(( )): HOST:PORT / digits first (bash evaluates the text)
    return (
        "set -euo pipefail; "
        "bad() { printf 'launch: %s=%q: expected %s\\n' \"$1\" \"$2\" \"$3\" >&2; exit 2; }; "
        "ep='^([A-Za-z0-9._-]+|\\[[0-9A-Fa-f:.]+\\]):([0-9]{1,5})$'; "
        'if [[ -n "${PET_RDZV_ENDPOINT:-}" ]]; then '
        '[[ $PET_RDZV_ENDPOINT =~ $ep ]] || bad PET_RDZV_ENDPOINT "$PET_RDZV_ENDPOINT" HOST:PORT; '
        'pf=(--rdzv-endpoint "${BASH_REMATCH[1]}:$((10#${BASH_REMATCH[2]} + 1))" '
        f"--rdzv-id {rid} --max-restarts 0); "
        f'else port=${{PET_MASTER_PORT:-{spec.rdzv.port}}}; '
        '[[ $port =~ ^[0-9]{1,5}$ ]] || bad PET_MASTER_PORT "$port" "a port number"; '
        'pf=(--master-port "$((10#$port + 1))"); fi; '
        f'torchrun "${{pf[@]}}" {check} || '
        '{ echo "launch: preflight failed (see above): not starting training" >&2; exit 3; }; '
        'exec torchrun "$@"'
    )
