"""Kubernetes manifests for the job: Kubeflow Trainer v2 and training-operator v1.

Two APIs, one pod template (``templates/_k8s_pod.yaml.j2``):

* ``trainer.kubeflow.org/v1alpha1`` (Kubeflow Trainer v2, checked against v2.3.0), the default
  for fixed-size jobs. ``launch k8s-runtime`` renders a ``ClusterTrainingRuntime`` holding what
  the profile and fabric need (NCCL environment, /dev/shm, RDMA, IPC_LOCK, grace period, node
  selection, gang scheduling); ``launch k8s --api trainjob`` renders a ``TrainJob`` that refers to
  it and sets only image, arguments, node count and resources. The Torch plugin injects
  ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK`` and ``PET_MASTER_ADDR/PORT`` into the
  container named ``node`` (kubeflow/trainer ``pkg/runtime/framework/plugins/torch/torch.go``).
  Trainer v2 has no elastic mode, so ``--nnodes MIN:MAX`` needs ``--api pytorchjob``.
* ``kubeflow.org/v1`` ``PyTorchJob`` (training-operator >= 1.8, checked against v1.9): for elastic
  jobs and clusters still on v1. ``spec.nprocPerNode`` becomes ``PET_NPROC_PER_NODE``; fixed
  size is ``Master`` (1) + ``Worker`` (N-1) with ``PET_MASTER_ADDR/PORT``, ``PET_NNODES``,
  ``PET_NODE_RANK``; elastic is ``Worker`` only with ``PET_RDZV_ENDPOINT`` (worker-0),
  ``PET_NNODES=MIN:MAX``, ``PET_MAX_RESTARTS`` (``pkg/controller.v1/pytorch/envvar.go``,
  ``master.go``, ``elastic.go``).

Multi-node jobs on a profile with multi-node NVLink (GB200 NVL72) get a ``ComputeDomain`` of the
NVIDIA DRA driver, its IMEX channel as a pod resource claim, pod affinity on the
``nvidia.com/gpu.clique`` node label, and the profile's ``compute_domain`` environment
(``NCCL_MNNVL_ENABLE=1``); single-tray jobs get none of it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass

from launch.commandline import preflight_train_args, training_args
from launch.envplan import EnvPlan, build_env
from launch.errors import SpecError
from launch.render import header_lines, render
from launch.spec import JobSpec, check_env_name, check_unique_env, parse_quantity

CONTAINER_NAME = "pytorch"  # training-operator v1: PyTorchJobDefaultContainerName
TRAINER_CONTAINER = "node"  # Trainer v2: constants.Node, where the Torch plugin injects PET_*
PORT_NAME = "pytorchjob-port"
# Trainer v2 rejects these in TrainJob.spec.trainer.env (constants.TorchRunReservedEnvNames).
TORCHRUN_RESERVED_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
GANG_TIMEOUT_S = 300
CLAIM_NAME = "imex-channel"
GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_PVC = "checkpoints"
DEFAULT_SHM = "64Gi"
DEFAULT_BACKOFF_LIMIT = 3
DEFAULT_TTL_S = 7 * 24 * 3600
SECRETISH = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|PRIVATE_KEY)", re.I)
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


@dataclass(frozen=True)
class SecretEnv:
    name: str
    secret: str
    key: str


@dataclass(frozen=True)
class K8sOptions:
    namespace: str | None = None
    pvc: str = DEFAULT_PVC
    shm_size: str = DEFAULT_SHM
    rdma_resource: tuple[str, int | None] | None = None  # override of the fabric's resource
    queue: str | None = None  # Kueue LocalQueue
    gang: bool = False
    image_pull_secrets: tuple[str, ...] = ()
    node_selector: tuple[tuple[str, str], ...] = ()
    pod_annotations: tuple[tuple[str, str], ...] = ()
    backoff_limit: int = DEFAULT_BACKOFF_LIMIT
    ttl_seconds: int = DEFAULT_TTL_S
    secret_env: tuple[SecretEnv, ...] = ()
    api: str | None = None  # None: trainjob for fixed-size jobs, pytorchjob for elastic ones
    runtime: str | None = None  # ClusterTrainingRuntime name; default derived from its content
    compute_domain: bool = True  # render a ComputeDomain where the profile needs one


# --------------------------------------------------------------------------- option parsing


def _dns_subdomain(option: str, value: str) -> str:
    if not value or len(value) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(value):
        raise SpecError(f"{option} {value!r}: not a valid Kubernetes object name")
    return value


def _key_value(option: str, item: str, value_pattern: re.Pattern | None) -> tuple[str, str]:
    if "=" not in item:
        raise SpecError(f"{option} {item!r}: expected KEY=VALUE")
    key, value = item.split("=", 1)
    if len(key) > 316 or not _QUALIFIED_NAME.fullmatch(key):
        raise SpecError(f"{option} {item!r}: {key!r} is not a valid Kubernetes key")
    if value_pattern is not None and (len(value) > 63 or not value_pattern.fullmatch(value)):
        raise SpecError(f"{option} {item!r}: {value!r} is not a valid label value")
    if "\x00" in value or any("\ud800" <= ch <= "\udfff" for ch in item):
        raise SpecError(f"{option} {item!r}: contains NUL or a non-UTF-8 byte")
    return key, value


def parse_rdma_resource(value: str | None) -> tuple[str, int | None] | None:
    if value is None:
        return None
    name, _, count = value.partition("=")
    if not re.fullmatch(r"[a-z0-9.-]+/[A-Za-z0-9._-]+", name) or (count and not re.fullmatch(r"[0-9]{1,6}", count)):
        raise SpecError(f"--rdma-resource {value!r}: expected DOMAIN/NAME[=COUNT], e.g. rdma/ib=1")
    if count and int(count) < 1:
        raise SpecError(f"--rdma-resource {value!r}: COUNT must be at least 1")
    return name, int(count) if count else None


# Variables whose only allowed value launch knows (NVLink multicast stays off): a Secret's
# value is not known when rendering, so these can never come from one.
NEVER_FROM_SECRET = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")


def parse_secret_env(values, allow_undocumented_nccl: bool = False) -> tuple[SecretEnv, ...]:
    """Same gates as --env: valid, unique, documented NCCL names; never the NVLS switches."""
    out = []
    for item in values:
        match = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)=([^:]+):([-._A-Za-z0-9]+)", item)
        if not match:
            raise SpecError(f"--env-secret {item!r}: expected NAME=SECRET:KEY")
        name = check_env_name("--env-secret", match.group(1), allow_undocumented_nccl)
        if name in NEVER_FROM_SECRET:
            raise SpecError(f"--env-secret {name}: refused; launch sets it itself or not at all (NVLink "
                            "multicast stays off) and a Secret's value cannot be checked")
        if len(match.group(3)) > 253:
            raise SpecError(f"--env-secret {item!r}: KEY longer than 253 characters")
        out.append(SecretEnv(name, _dns_subdomain("--env-secret", match.group(2)), match.group(3)))
    check_unique_env(s.name for s in out)
    return tuple(out)


def parse_options(
    namespace, pvc, shm_size, rdma_resource, queue, gang, pull_secrets, node_selector,
    pod_annotations, backoff_limit, ttl_seconds, secret_env, api=None, runtime=None, compute_domain=True,
    allow_undocumented_nccl: bool = False,
) -> K8sOptions:
    if namespace is not None and (len(namespace) > 63 or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", namespace)):
        raise SpecError(f"--namespace {namespace!r}: not a valid namespace name")
    if queue is not None and (len(queue) > 63 or not _LABEL_VALUE.fullmatch(queue) or not queue):
        raise SpecError(f"--queue {queue!r}: not a valid label value")
    if backoff_limit < 0 or ttl_seconds < 0:
        raise SpecError("--backoff-limit and --ttl-seconds must be 0 or more")
    return K8sOptions(
        namespace=namespace,
        pvc=_dns_subdomain("--pvc", pvc),
        shm_size=parse_quantity("--shm-size", shm_size),
        rdma_resource=parse_rdma_resource(rdma_resource),
        queue=queue,
        gang=bool(gang),
        image_pull_secrets=tuple(_dns_subdomain("--image-pull-secret", s) for s in pull_secrets),
        node_selector=tuple(_key_value("--node-selector", s, _LABEL_VALUE) for s in node_selector),
        pod_annotations=tuple(_key_value("--pod-annotation", s, None) for s in pod_annotations),
        backoff_limit=backoff_limit,
        ttl_seconds=ttl_seconds,
        secret_env=parse_secret_env(secret_env, allow_undocumented_nccl),
        api=api,
        runtime=None if runtime is None else _dns_subdomain("--runtime", runtime),
        compute_domain=bool(compute_domain),
    )


# --------------------------------------------------------------------------- manifest


def replica_layout(spec: JobSpec) -> list[tuple[str, int]]:
    if spec.nodes.elastic:
        return [("Worker", spec.nodes.max)]
    if spec.nodes.max == 1:
        return [("Master", 1)]
    return [("Master", 1), ("Worker", spec.nodes.max - 1)]


def _check_names(spec: JobSpec, layout: list[tuple[str, int]]) -> None:
    # The operator names pods and Services <job>-<role>-<index>; Services are DNS-1035 labels.
    for role, replicas in layout:
        longest = f"{spec.name}-{role.lower()}-{replicas - 1}"
        if len(longest) > 63:
            raise SpecError(
                f"--name {spec.name!r} is too long for Kubernetes: the operator's Service "
                f"{longest!r} would exceed 63 characters"
            )


def _rdma(spec: JobSpec, opts: K8sOptions) -> tuple[str, int, str] | None:
    fabric = spec.fabric.rdma_resource
    if fabric is None and opts.rdma_resource is None:
        return None
    name = opts.rdma_resource[0] if opts.rdma_resource else fabric.name
    count = (opts.rdma_resource[1] if opts.rdma_resource else None) or (fabric.count if fabric else None)
    if count is None:
        raise SpecError(
            f"fabric {spec.fabric.name!r} needs the RDMA resource count for this cluster: "
            f"--rdma-resource {name}=COUNT" + (f" ({fabric.why})" if fabric else "")
        )
    why = fabric.why if fabric else "--rdma-resource"
    return name, count, why


def secret_warnings(spec: JobSpec) -> list[str]:
    return [
        f"--env {name} looks like a secret and is rendered in plain text; use --env-secret {name}=SECRET:KEY"
        for name, _ in spec.env
        if SECRETISH.search(name)
    ]


def resolve_api(spec: JobSpec, opts: K8sOptions) -> str:
    if opts.api is None:
        return "pytorchjob" if spec.nodes.elastic else "trainjob"
    if opts.api == "trainjob" and spec.nodes.elastic:
        raise SpecError(
            f"--nnodes {spec.nodes.torchrun_value}: Kubeflow Trainer v2 (TrainJob) has no elastic mode; "
            "use --api pytorchjob (training-operator v1 elasticPolicy) or a fixed --nnodes N"
        )
    return opts.api


def uses_compute_domain(spec: JobSpec, opts: K8sOptions) -> bool:
    """A ComputeDomain (IMEX channels) only for multi-node jobs on multi-node NVLink hardware."""
    return bool(spec.profile.compute_domain_env) and spec.nodes.multi_node and opts.compute_domain


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
    args: tuple | None
    port: Port | None
    env: tuple
    secret_env: tuple
    resources: tuple  # (resource, quantity, why or None)
    ipc_lock: bool
    checkpoint_dir: str
    shm_size: str
    pvc: str
    preflight: str | None = None  # --preflight: the container's `bash -c` wrapper (preflight_script)


@dataclass(frozen=True)
class Runtime:
    kind: str
    name: str


@dataclass(frozen=True)
class Gang:
    timeout: int


@dataclass(frozen=True)
class TrainJobSpec:
    image: str
    args: tuple
    num_nodes: int
    nproc: int
    env: tuple
    secret_env: tuple
    resources: tuple  # (resource, quantity)
    runtime_why: str


def _compute_domain(spec: JobSpec, opts: K8sOptions) -> ComputeDomain | None:
    if not uses_compute_domain(spec, opts):
        return None
    labels = {k: v for k, v in _job_labels(spec, opts).items() if k != "kueue.x-k8s.io/queue-name"}
    return ComputeDomain(
        name=f"{spec.name}-imex",
        template=f"{spec.name}-imex-channel",
        claim=CLAIM_NAME,
        num_nodes=0 if spec.nodes.elastic else spec.nodes.max,
        labels=labels,
    )


def _node_selector(spec: JobSpec, opts: K8sOptions) -> dict:
    node_selector = {"kubernetes.io/arch": spec.profile.cpu_arch, "nvidia.com/gpu.present": "true"}
    node_selector.update(dict(spec.profile.node_selector))
    node_selector.update(dict(opts.node_selector))
    return node_selector


def _job_labels(spec: JobSpec, opts: K8sOptions) -> dict:
    labels = {"app.kubernetes.io/name": spec.name, "app.kubernetes.io/managed-by": "launch"}
    if opts.queue:
        labels["kueue.x-k8s.io/queue-name"] = opts.queue
    return labels


def _pod(spec: JobSpec, plan: EnvPlan, opts: K8sOptions, *, gpus: int, extra_resources=(), **fields) -> Pod:
    """The pod template every API shares; ``fields`` fill in what differs per API."""
    rdma = _rdma(spec, opts)
    resources = [(GPU_RESOURCE, str(gpus), None)]
    if rdma:
        resources.append((rdma[0], str(rdma[1]), rdma[2]))
    resources += [(key, value, None) for key, value in extra_resources]
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
        "resources": tuple(resources),
        "ipc_lock": spec.fabric.ipc_lock,
        "checkpoint_dir": spec.checkpoint_dir,
        "shm_size": opts.shm_size,
        "pvc": opts.pvc,
        "selector_name": spec.name if domain else None,
    }
    values.update(fields)
    return Pod(**values)


def _cpu_memory(spec: JobSpec) -> list[tuple[str, str]]:
    if spec.resources.cpus is not None:
        parse_quantity("--cpus", spec.resources.cpus)
    out = []
    if spec.resources.cpus:
        out.append(("cpu", spec.resources.cpus))
    if spec.resources.memory:
        out.append(("memory", spec.resources.memory))
    return out


def _check_unique_env(plan: EnvPlan, opts: K8sOptions) -> None:
    # a Secret-backed variable next to a plain one of the same name: which wins is up to
    # the API server's merge; refuse instead
    check_unique_env([*(v.name for v in plan.variables), *(s.name for s in opts.secret_env)])


# --------------------------------------------------------------------------- PyTorchJob (v1)


def pytorchjob(spec: JobSpec, plan: EnvPlan, command: str, opts: K8sOptions) -> str:
    _check_unique_env(plan, opts)
    layout = replica_layout(spec)
    _check_names(spec, layout)
    domain = _compute_domain(spec, opts)
    if domain:
        plan = build_env(spec, compute_domain=True)
    pod = _pod(
        spec, plan, opts,
        labels={"app.kubernetes.io/name": spec.name, "app.kubernetes.io/component": "trainer"},
        container=CONTAINER_NAME,
        image=spec.image,
        args=tuple(training_args(spec)),
        preflight=preflight_script(spec),
        port=Port(PORT_NAME, spec.rdzv.port),
        secret_env=opts.secret_env,
        gpus=spec.nproc_per_node,
        extra_resources=_cpu_memory(spec),
        compute_domain=domain,
    )
    return render(
        "pytorchjob.yaml.j2",
        header=header_lines(command, spec),
        name=spec.name,
        namespace=opts.namespace,
        job_labels=_job_labels(spec, opts),
        nproc=spec.nproc_per_node,
        elastic=spec.nodes.elastic,
        nodes=spec.nodes,
        rdzv=spec.rdzv,
        max_restarts=spec.max_restarts,
        layout=layout,
        gang_min=spec.nodes.min if opts.gang else None,
        opts=opts,
        pod=pod,
        compute_domain=domain,
    )


# --------------------------------------------------------------------------- Trainer v2


def _runtime_pod(spec: JobSpec, opts: K8sOptions, domain: ComputeDomain | None, image: str) -> Pod:
    """The runtime's pod: profile, fabric and torch settings, without the per-job --env."""
    plan = build_env(dataclasses.replace(spec, env=()), compute_domain=domain is not None)
    labels = {"app.kubernetes.io/component": "trainer"}
    if domain:  # a per-job runtime: the pod-affinity selector needs the job's own label
        labels = {"app.kubernetes.io/name": spec.name, **labels}
    return _pod(
        spec, plan, opts,
        labels=labels,
        restart_policy="Never",
        container=TRAINER_CONTAINER,
        image=image,
        args=None,  # per job: TrainJob.spec.trainer.args
        gpus=spec.profile.gpus_per_node,  # default; TrainJob.spec.trainer.resourcesPerNode per job
        compute_domain=domain,
    )


def default_runtime_name(spec: JobSpec, opts: K8sOptions) -> str:
    """``<profile>-<fabric>-<hash>``: the hash covers what the runtime does (environment
    values, pod settings, scheduling) but not its image, which every TrainJob replaces, nor
    the comments, so a TrainJob rendered with the same options always names a runtime with
    exactly that content."""
    pod = _runtime_pod(spec, opts, None, "")
    content = dataclasses.asdict(pod)
    if content.get("preflight") is None:  # names stay as they were before --preflight existed
        content.pop("preflight", None)
    content["env"] = [(v.name, v.value) for v in pod.env]
    content["resources"] = [(key, value) for key, value, _ in pod.resources]
    content["runtime"] = {"gang": GANG_TIMEOUT_S if opts.gang else None, "restarts": opts.backoff_limit,
                          "ttl": opts.ttl_seconds, "api": "trainer.kubeflow.org/v1alpha1"}
    digest = hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:8]
    # profile/fabric names are file stems: keep what a Kubernetes name allows
    prefix = re.sub(r"[^a-z0-9]+", "-", f"{spec.profile.name}-{spec.fabric.name}".lower()).strip("-")[:54]
    return f"{prefix}-{digest}" if prefix else f"runtime-{digest}"


def _check_trainjob(spec: JobSpec, opts: K8sOptions) -> None:
    if spec.preflight.enabled:
        raise SpecError("--preflight: rendered for --api pytorchjob only so far (a TrainJob's command "
                        "comes from its runtime)")
    # JobSet's webhook: <jobset>-<replicatedJob>-<job index>-<pod index> plus the pod's
    # 5-character random suffix must be a DNS-1035 label (jobset pkg/webhooks/jobset_webhook.go)
    longest = f"{spec.name}-{TRAINER_CONTAINER}-0-{spec.nodes.max - 1}-xxxxx"
    if len(longest) > 63:
        raise SpecError(
            f"--name {spec.name!r} is too long for Kubernetes: JobSet's pod name "
            f"{longest!r} would exceed 63 characters"
        )
    reserved = [name for name, _ in spec.env if name in TORCHRUN_RESERVED_ENV]
    reserved += [s.name for s in opts.secret_env if s.name in TORCHRUN_RESERVED_ENV]
    if reserved:
        raise SpecError(f"--env {reserved[0]}: reserved for the Trainer's Torch plugin, which sets it itself")


def cluster_runtime(spec: JobSpec, command: str, opts: K8sOptions) -> str:
    if spec.preflight.enabled:
        raise SpecError("--preflight: rendered for --api pytorchjob only so far (a TrainJob's command "
                        "comes from its runtime)")
    if opts.queue:
        raise SpecError(
            "--queue is per job: pass it to `launch k8s --api trainjob` (Kueue admits the TrainJob "
            "by its kueue.x-k8s.io/queue-name label)"
        )
    if opts.namespace:
        raise SpecError("--namespace: a ClusterTrainingRuntime is cluster-scoped")
    if opts.secret_env:
        raise SpecError("--env-secret is per job: pass it to `launch k8s --api trainjob`")
    if spec.train_args:
        raise SpecError("arguments after `--` are per job: pass them to `launch k8s --api trainjob`")
    if uses_compute_domain(spec, opts):
        raise SpecError(
            f"profile {spec.profile.name!r} with {spec.nodes.max} nodes needs a ComputeDomain per job, "
            "which a shared ClusterTrainingRuntime cannot hold (TrainJob.runtimePatches cannot add "
            "resourceClaims in Trainer v2.3): render the job with `launch k8s --api trainjob`, "
            "which bundles the ComputeDomain and a TrainingRuntime of its own"
        )
    return render(
        "trainingruntime.yaml.j2",
        header=header_lines(command, spec),
        runtime=Runtime("ClusterTrainingRuntime", opts.runtime or default_runtime_name(spec, opts)),
        gang=Gang(GANG_TIMEOUT_S) if opts.gang else None,
        opts=opts,
        namespace=None,
        pod=_runtime_pod(spec, opts, None, spec.image),
        compute_domain=None,
        trainjob=None,
        name=None,
        job_labels={},
    )


def trainjob(spec: JobSpec, plan: EnvPlan, command: str, opts: K8sOptions) -> str:
    _check_unique_env(plan, opts)
    _check_trainjob(spec, opts)
    domain = _compute_domain(spec, opts)
    if domain and opts.runtime:
        raise SpecError("--runtime: a job with a ComputeDomain brings its own TrainingRuntime")
    if domain:
        runtime = Runtime("TrainingRuntime", spec.name)
        why = ("the job's own TrainingRuntime (above): it holds the ComputeDomain's IMEX channel "
               "claim and the NVLink-domain affinity")
    else:
        runtime = Runtime("ClusterTrainingRuntime", opts.runtime or default_runtime_name(spec, opts))
        why = (f"profile {spec.profile.name} + fabric {spec.fabric.name}: render it with "
               "`launch k8s-runtime` and the same options")
    job = TrainJobSpec(
        image=spec.image,
        args=tuple(training_args(spec)),
        num_nodes=spec.nodes.max,
        nproc=spec.nproc_per_node,
        env=spec.env,
        secret_env=opts.secret_env,
        resources=((GPU_RESOURCE, str(spec.nproc_per_node)), *_cpu_memory(spec)),
        runtime_why=why,
    )
    context = {"header": header_lines(command, spec), "name": spec.name, "namespace": opts.namespace,
               "job_labels": _job_labels(spec, opts), "trainjob": job, "runtime": runtime}
    if not domain:
        return render("trainjob.yaml.j2", **context)
    return render(
        "trainingruntime.yaml.j2", **context,
        gang=Gang(GANG_TIMEOUT_S) if opts.gang else None,
        opts=opts,
        pod=_runtime_pod(spec, opts, domain, spec.image),
        compute_domain=domain,
    )


def preflight_script(spec: JobSpec) -> str | None:
    """--preflight in a pod: ``bash -c SCRIPT launch-preflight TRAIN_ARGS...`` runs ``train
    preflight`` through torchrun (the operator's PET_* variables give it the nodes) on the
    rendezvous port + 1, then execs the training torchrun with the pod's args."""
    if not spec.preflight.enabled:
        return None
    import shlex

    check = " ".join(shlex.quote(a) for a in preflight_train_args(spec))
    rid = shlex.quote(f"{spec.rdzv.id}-preflight")
    return (
        "set -euo pipefail; "
        'if [[ -n "${PET_RDZV_ENDPOINT:-}" ]]; then '
        'pf=(--rdzv-endpoint "${PET_RDZV_ENDPOINT%:*}:$((${PET_RDZV_ENDPOINT##*:} + 1))" '
        f"--rdzv-id {rid} --max-restarts 0); "
        f'else pf=(--master-port "$((${{PET_MASTER_PORT:-{spec.rdzv.port}}} + 1))"); fi; '
        f'torchrun "${{pf[@]}}" {check} || '
        '{ echo "launch: preflight failed (see above): not starting training" >&2; exit 3; }; '
        'exec torchrun "$@"'
    )
