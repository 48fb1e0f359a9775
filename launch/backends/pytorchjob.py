"""``launch k8s --api pytorchjob``: a training-operator v1 ``PyTorchJob`` (fixed-size or elastic),
with a ComputeDomain where the profile needs one (see ``k8s_pod``)."""

from __future__ import annotations

from core.errors import SpecError
from launch.backends.base import Job
from launch.backends.k8s_options import K8sOptions
from launch.backends.k8s_pod import (
    Port,
    check_manifest_size,
    check_unique_pod_env,
    compute_domain,
    job_labels,
    pod,
    preflight_script,
)
from launch.commandline import training_args
from launch.envnames import Owned
from launch.envplan import build_env
from launch.render import header_lines, render
from launch.spec import JobSpec

CONTAINER_NAME = "pytorch"  # training-operator v1: PyTorchJobDefaultContainerName
PORT_NAME = "pytorchjob-port"
PYTORCHJOB_OWNED = Owned(
    "the training operator (PyTorchJob: pkg/controller.v1/pytorch/envvar.go)",
    frozenset(("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")),
    ("PET_",),
)


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


def render_job(job: Job, opts: K8sOptions) -> str:
    spec, plan = job.spec, job.plan
    check_unique_pod_env(plan, opts)
    layout = replica_layout(spec)
    _check_names(spec, layout)
    domain = compute_domain(spec, opts)
    if domain:
        plan = build_env(spec, compute_domain=True)
    the_pod = pod(
        spec, plan, opts,
        labels={"app.kubernetes.io/name": spec.name, "app.kubernetes.io/component": "trainer"},
        container=CONTAINER_NAME,
        image=spec.image,
        args=tuple(training_args(spec, container=True)),
        preflight=preflight_script(spec),
        port=Port(PORT_NAME, spec.rdzv.port),
        secret_env=opts.secret_env,
        gpus=spec.nproc_per_node,
        compute_domain=domain,
    )
    return check_manifest_size(render(
        "pytorchjob.yaml.j2",
        header=header_lines(job.command, spec),
        name=spec.name,
        namespace=opts.namespace,
        job_labels=job_labels(spec, opts),
        nproc=spec.nproc_per_node,
        elastic=spec.nodes.elastic,
        nodes=spec.nodes,
        rdzv=spec.rdzv,
        max_restarts=spec.max_restarts,
        layout=layout,
        gang_min=spec.nodes.min if opts.gang else None,
        opts=opts,
        pod=the_pod,
        compute_domain=domain,
    ))
