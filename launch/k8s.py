"""Kubeflow training-operator v1 ``PyTorchJob`` for the job.

Operator contract this renders for (training-operator >= 1.8, ``kubeflow.org/v1``):

* ``spec.nprocPerNode`` (string) - the operator turns it into ``PET_NPROC_PER_NODE``;
  the deprecated ``elasticPolicy.nProcPerNode`` is never used.
* Fixed size: ``Master`` (exactly 1 replica) plus ``Worker`` (N-1) - the operator injects
  ``PET_MASTER_ADDR/PORT``, ``PET_NNODES`` and ``PET_NODE_RANK``; single node: Master only.
* Elastic: ``Worker`` only (required with ``elasticPolicy``) - the operator injects
  ``PET_RDZV_ENDPOINT`` (worker-0), ``PET_RDZV_BACKEND``, ``PET_NNODES=MIN:MAX``,
  ``PET_MAX_RESTARTS``, ``PET_RDZV_ID``.
* The container named ``pytorch`` runs plain ``torchrun``, which reads every ``PET_*``
  variable as the default of the matching option, so no launcher flag is repeated here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from launch.commandline import training_args
from launch.envplan import EnvPlan
from launch.render import header_lines, render
from launch.spec import JobSpec, SpecError, check_env_name, check_unique_env, parse_quantity

CONTAINER_NAME = "pytorch"
PORT_NAME = "pytorchjob-port"
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
    pod_annotations, backoff_limit, ttl_seconds, secret_env, allow_undocumented_nccl: bool = False,
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


def pytorchjob(spec: JobSpec, plan: EnvPlan, command: str, opts: K8sOptions) -> str:
    # a Secret-backed variable next to a plain one of the same name: which wins is up to
    # the API server's merge; refuse instead
    check_unique_env([*(v.name for v in plan.variables), *(s.name for s in opts.secret_env)])
    layout = replica_layout(spec)
    _check_names(spec, layout)
    if spec.resources.cpus is not None:
        parse_quantity("--cpus", spec.resources.cpus)
    node_selector = {"kubernetes.io/arch": spec.profile.cpu_arch, "nvidia.com/gpu.present": "true"}
    node_selector.update(dict(spec.profile.node_selector))
    node_selector.update(dict(opts.node_selector))
    job_labels = {"app.kubernetes.io/name": spec.name, "app.kubernetes.io/managed-by": "launch"}
    if opts.queue:
        job_labels["kueue.x-k8s.io/queue-name"] = opts.queue
    pod_labels = {"app.kubernetes.io/name": spec.name, "app.kubernetes.io/component": "trainer"}
    return render(
        "pytorchjob.yaml.j2",
        header=header_lines(command, spec),
        name=spec.name,
        namespace=opts.namespace,
        job_labels=job_labels,
        pod_labels=pod_labels,
        pod_annotations=dict(opts.pod_annotations),
        nproc=spec.nproc_per_node,
        elastic=spec.nodes.elastic,
        nodes=spec.nodes,
        rdzv=spec.rdzv,
        max_restarts=spec.max_restarts,
        layout=layout,
        gang_min=spec.nodes.min if opts.gang else None,
        opts=opts,
        grace=spec.grace_period_s,
        image=spec.image,
        node_selector=node_selector,
        args=training_args(spec),
        env=plan.variables,
        secret_env=opts.secret_env,
        rdma=_rdma(spec, opts),
        ipc_lock=spec.fabric.ipc_lock,
        cpus=spec.resources.cpus,
        memory=spec.resources.memory,
        checkpoint_dir=spec.checkpoint_dir,
        container=CONTAINER_NAME,
        port_name=PORT_NAME,
        gpu_resource=GPU_RESOURCE,
    )
