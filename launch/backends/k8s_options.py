"""The Kubernetes options shared by ``launch k8s`` and ``launch k8s-runtime`` (``K8sOptions``),
their parsing, and the choice between the two job APIs."""

from __future__ import annotations

import re
from dataclasses import dataclass

import click

from core.clicktypes import StrictInt
from core.errors import SpecError
from core.safety import excerpt
from launch import defaults
from launch.commandline import out_warnings, unused_warnings
from launch.envnames import check_env_name, check_unique_env
from launch.spec import JobSpec, parse_quantity, quantity_value

ACCESS_MODES = ("ReadWriteMany", "ReadWriteOnce", "ReadOnlyMany", "ReadWriteOncePod")  # PersistentVolumeClaim
GPU_RESOURCE = "nvidia.com/gpu"  # the pod's GPU request (limits and requests)

SECRETISH = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|PRIVATE_KEY)", re.IGNORECASE)
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
# Variables whose only allowed value launch knows (NVLink multicast stays off): a Secret's
# value is not known when rendering, so these can never come from one.
NEVER_FROM_SECRET = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")


@dataclass(frozen=True)
class SecretEnv:
    name: str
    secret: str
    key: str


@dataclass(frozen=True)
class K8sOptions:
    namespace: str | None = None
    pvc: str = defaults.K8S_PVC
    pvc_access_mode: str = defaults.K8S_PVC_ACCESS_MODE  # the claim's access mode, as the user declares it
    shm_size: str = defaults.K8S_SHM_SIZE
    rdma_resource: tuple[str, int | None] | None = None  # override of the fabric's resource
    queue: str | None = None  # Kueue LocalQueue
    gang: bool = False
    image_pull_secrets: tuple[str, ...] = ()
    node_selector: tuple[tuple[str, str], ...] = ()
    pod_annotations: tuple[tuple[str, str], ...] = ()
    backoff_limit: int = defaults.K8S_BACKOFF_LIMIT
    ttl_seconds: int = defaults.K8S_TTL_S
    secret_env: tuple[SecretEnv, ...] = ()
    api: str | None = None  # None: trainjob for fixed-size jobs, pytorchjob for elastic ones
    runtime: str | None = None  # ClusterTrainingRuntime name; default derived from its content
    compute_domain: bool = True  # render a ComputeDomain where the profile needs one


def _dns_subdomain(option: str, value: str) -> str:
    if not value or len(value) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(value):
        raise SpecError(f"{option} {value!r}: not a valid Kubernetes object name")
    return value


def qualified_name(key: str) -> bool:
    """A Kubernetes qualified name (label and annotation keys, extended resource names):
    [PREFIX/]NAME, PREFIX a DNS-1123 subdomain of at most 253 characters, NAME at most 63."""
    prefix, _, name = key.rpartition("/")
    return bool(_QUALIFIED_NAME.fullmatch(key)) and len(prefix) <= 253 and len(name) <= 63


def parse_key_value(option: str, item: str, value_pattern: re.Pattern | None) -> tuple[str, str]:
    if "=" not in item:
        raise SpecError(f"{option} {excerpt(item)}: expected KEY=VALUE")
    key, value = item.split("=", 1)
    if not qualified_name(key):
        raise SpecError(f"{option} {excerpt(item)}: {excerpt(key)} is not a valid Kubernetes key "
                        "([PREFIX/]NAME, NAME of at most 63 characters, PREFIX a DNS subdomain of at most 253)")
    if value_pattern is not None and (len(value) > 63 or not value_pattern.fullmatch(value)):
        raise SpecError(f"{option} {item!r}: {value!r} is not a valid label value")
    if "\x00" in value or any("\ud800" <= ch <= "\udfff" for ch in item):
        raise SpecError(f"{option} {item!r}: contains NUL or a non-UTF-8 byte")
    return key, value


ANNOTATIONS_MAX_BYTES = 256 * 1024  # the API server's limit on all of an object's annotations together


def _annotations(items) -> tuple[tuple[str, str], ...]:
    pairs = _once("--pod-annotation", (parse_key_value("--pod-annotation", s, None) for s in items))
    size = sum(len(k.encode()) + len(v.encode("utf-8", "surrogateescape")) for k, v in pairs)
    if size > ANNOTATIONS_MAX_BYTES:
        raise SpecError(f"--pod-annotation: {size} bytes in all, more than the {ANNOTATIONS_MAX_BYTES} "
                        "Kubernetes accepts")
    return pairs


def _once(option: str, keys) -> tuple:
    """Each key once: a mapping in the manifest keeps the last value silently (a list entry twice
    is refused by the API server)."""
    keys = tuple(keys)
    names = [k[0] if isinstance(k, tuple) else k for k in keys]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise SpecError(f"{option} {name!r} is given twice")
    return keys


def parse_rdma_resource(value: str | None) -> tuple[str, int | None] | None:
    if value is None:
        return None
    name, _, count = value.partition("=")
    if (not re.fullmatch(r"[a-z0-9.-]+/[A-Za-z0-9._-]+", name) or not qualified_name(name)
            or (count and not re.fullmatch(r"[0-9]{1,6}", count))):
        raise SpecError(f"--rdma-resource {excerpt(value)}: expected DOMAIN/NAME[=COUNT], e.g. rdma/ib=1 "
                        "(NAME of at most 63 characters, DOMAIN of at most 253)")
    if count and int(count) < 1:
        raise SpecError(f"--rdma-resource {value!r}: COUNT must be at least 1")
    if name == GPU_RESOURCE:
        raise SpecError(f"--rdma-resource {excerpt(value)}: {GPU_RESOURCE} is the pod's GPU request already "
                        "(--nproc-per-node); name the RDMA device plugin's resource")
    return name, int(count) if count else None


def parse_secret_env(values, allow_undocumented_nccl: bool = False) -> tuple[SecretEnv, ...]:
    """Same gates as --env: valid, unique, documented NCCL names; never the NVLS switches."""
    out = []
    for item in values:
        match = re.fullmatch(r"([^=]+)=([^:]+):([-._A-Za-z0-9]+)", item)
        if not match:
            raise SpecError(f"--env-secret {item!r}: expected NAME=SECRET:KEY")
        name = check_env_name("--env-secret", match.group(1), allow_undocumented_nccl, k8s=True)
        if name in NEVER_FROM_SECRET:
            raise SpecError(f"--env-secret {name}: refused; launch sets it itself or not at all (NVLink "
                            "multicast stays off) and a Secret's value cannot be checked")
        key = match.group(3)
        if len(key) > 253 or key == "." or key.startswith(".."):  # the API server's Secret key rule
            raise SpecError(f"--env-secret {item!r}: KEY of at most 253 characters, not '.' or starting with '..'")
        out.append(SecretEnv(name, _dns_subdomain("--env-secret", match.group(2)), match.group(3)))
    check_unique_env(s.name for s in out)
    return tuple(out)


def parse_options(
    namespace, pvc, shm_size, rdma_resource, queue, gang, pull_secrets, node_selector,
    pod_annotations, backoff_limit, ttl_seconds, secret_env, api=None, runtime=None, compute_domain=True,
    allow_undocumented_nccl: bool = False, pvc_access_mode: str = defaults.K8S_PVC_ACCESS_MODE,
) -> K8sOptions:
    if namespace is not None and (len(namespace) > 63 or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", namespace)):
        raise SpecError(f"--namespace {namespace!r}: not a valid namespace name")
    # Kueue's webhook takes the queue-name label only as a LocalQueue name that is also a label
    # value: a DNS-1123 subdomain of at most 63 characters (lower case; Team_A is refused there)
    if queue is not None and (len(queue) > 63 or not _DNS1123_SUBDOMAIN.fullmatch(queue)):
        raise SpecError(f"--queue {excerpt(queue)}: a Kueue LocalQueue name is at most 63 lower-case letters, digits, "
                        "'-' and '.', starting and ending with a letter or digit")
    if backoff_limit < 0 or ttl_seconds < 0:
        raise SpecError("--backoff-limit and --ttl-seconds must be 0 or more")
    return K8sOptions(
        namespace=namespace,
        pvc=_dns_subdomain("--pvc", pvc),
        pvc_access_mode=pvc_access_mode,
        shm_size=parse_quantity("--shm-size", shm_size),
        rdma_resource=parse_rdma_resource(rdma_resource),
        queue=queue,
        gang=bool(gang),
        image_pull_secrets=_once("--image-pull-secret", (_dns_subdomain("--image-pull-secret", s) for s in pull_secrets)),
        node_selector=_once("--node-selector", (parse_key_value("--node-selector", s, LABEL_VALUE) for s in node_selector)),
        pod_annotations=_annotations(pod_annotations),
        backoff_limit=backoff_limit,
        ttl_seconds=ttl_seconds,
        secret_env=parse_secret_env(secret_env, allow_undocumented_nccl),
        api=api,
        runtime=None if runtime is None else _dns_subdomain("--runtime", runtime),
        compute_domain=bool(compute_domain),
    )


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


def k8s_params() -> list:
    """The click options of `launch k8s` and `launch k8s-runtime` (fresh objects each call)."""
    return [
        click.Option(["--namespace"], default=None),
        click.Option(["--pvc"], default=defaults.K8S_PVC, show_default=True,
                     help="PersistentVolumeClaim for --checkpoint-dir."),
        click.Option(["--pvc-access-mode"], type=click.Choice(list(ACCESS_MODES)),
                     default=defaults.K8S_PVC_ACCESS_MODE, show_default=True,
                     help="The --pvc claim's access mode: a multi-node job needs ReadWriteMany (every node "
                          "mounts it), the trainer a writable claim."),
        click.Option(["--shm-size"], default=defaults.K8S_SHM_SIZE, show_default=True,
                     help="Size limit of the memory-backed /dev/shm (counts against the pod's memory limit)."),
        click.Option(["--rdma-resource"], default=None, metavar="DOMAIN/NAME[=COUNT]",
                     help="RDMA device-plugin resource; default from the fabric."),
        click.Option(["--queue"], default=None, help="Kueue LocalQueue (label kueue.x-k8s.io/queue-name on the job)."),
        click.Option(["--gang"], is_flag=True,
                     help="Gang scheduling: runtime podGroupPolicy.coscheduling (TrainJob) or "
                          "runPolicy.schedulingPolicy.minAvailable (PyTorchJob)."),
        click.Option(["--image-pull-secret"], multiple=True, help="Registry credentials Secret name (repeatable)."),
        click.Option(["--node-selector"], multiple=True, metavar="KEY=VALUE"),
        click.Option(["--pod-annotation"], multiple=True, metavar="KEY=VALUE", help="E.g. a Multus network for RoCE."),
        click.Option(["--backoff-limit"], type=StrictInt(0, 1000), default=defaults.K8S_BACKOFF_LIMIT,
                     show_default=True,
                     help="PyTorchJob runPolicy.backoffLimit / runtime JobSet failurePolicy.maxRestarts."),
        click.Option(["--ttl-seconds"], type=StrictInt(0, 2**31 - 1), default=defaults.K8S_TTL_S, show_default=True,
                     help="Seconds a finished job is kept (ttlSecondsAfterFinished)."),
        click.Option(["--env-secret"], multiple=True, metavar="NAME=SECRET:KEY", help="Env var from a Secret key."),
        click.Option(["--runtime"], default=None, metavar="NAME",
                     help="ClusterTrainingRuntime name; default <profile>-<fabric>-<hash of its content>."),
        click.Option(["--compute-domain/--no-compute-domain"], default=True, show_default=True,
                     help="Multi-node jobs on multi-node NVLink profiles (gb200): a DRA ComputeDomain "
                          "(IMEX channel), NVLink-domain pod affinity and NCCL_MNNVL_ENABLE=1."),
    ]


def parse_k8s(extra: dict, job_options: dict) -> K8sOptions:
    """``Backend.parse`` of the Kubernetes backends: ``extra`` holds :func:`k8s_params`' values."""
    return parse_options(
        extra["namespace"], extra["pvc"], extra["shm_size"], extra["rdma_resource"], extra["queue"],
        extra["gang"], extra["image_pull_secret"], extra["node_selector"], extra["pod_annotation"],
        extra["backoff_limit"], extra["ttl_seconds"], extra["env_secret"], api=extra.get("api"),
        runtime=extra["runtime"], compute_domain=extra["compute_domain"],
        allow_undocumented_nccl=job_options["allow_undocumented_nccl"], pvc_access_mode=extra["pvc_access_mode"],
    )


def shm_warnings(spec: JobSpec, opts: K8sOptions) -> list[str]:
    """/dev/shm is memory-backed: what is written there counts against the pod's memory limit."""
    profile = {key: value for key, value, _ in spec.profile.k8s_resources}
    memory = spec.resources.memory or profile.get("memory")
    where = "--memory" if spec.resources.memory else f"profile {spec.profile.name!r} k8s.resources.memory"
    if not memory or memory == "0" or parse_quantity(where, memory) is None:
        return []
    if quantity_value(memory) <= quantity_value(opts.shm_size):
        return [f"k8s: --shm-size {opts.shm_size} is not below the pod's memory limit {memory}: /dev/shm counts "
                "against it, so the training processes would be OOM-killed before /dev/shm fills"]
    return []


def k8s_warnings(job, opts: K8sOptions) -> list[str]:
    spec = job.spec
    mounts = (["k8s: --mount host paths are not rendered; the checkpoint PVC (--pvc) is mounted instead"]
              if spec.mounts else [])
    return (mounts + shm_warnings(spec, opts) + secret_warnings(spec) + out_warnings(spec, "k8s", mounts=False)
            + unused_warnings(spec, "k8s", "the operator names the rendezvous host", endpoint_host=False))
