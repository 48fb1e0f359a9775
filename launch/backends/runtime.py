"""``launch k8s-runtime``: a Kubeflow Trainer v2 ``ClusterTrainingRuntime`` holding what the
profile and fabric need; TrainJobs rendered with the same options refer to it by name."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re

from core.errors import SpecError
from launch.backends.base import Job
from launch.backends.k8s_options import K8sOptions, k8s_params, k8s_warnings, parse_k8s
from launch.backends.k8s_pod import (
    GANG_TIMEOUT_S,
    ComputeDomain,
    Gang,
    Pod,
    Runtime,
    check_manifest_size,
    pod,
    refuse_preflight,
    uses_compute_domain,
)
from launch.backends.registry import Backend, owners, register
from launch.envnames import TORCHRUN_OWNED, Owned
from launch.envplan import build_env
from launch.render import header_lines, render
from launch.spec import JobSpec

TRAINER_CONTAINER = "node"  # Trainer v2: constants.Node, where the Torch plugin injects PET_*
# The runtime's one replicatedJob (the trainer's nodes); its pods are <job>-<replicatedJob>-0-<rank>.
# Trainer v2.4.0 refuses a runtime whose replicatedJob names exceed 20 characters (release notes,
# "limit ReplicatedJob name length to 20 characters in runtimes"); v2.3.0 only needs a DNS-1035 label.
REPLICATED_JOB = "node"
REPLICATED_JOB_MAX = 20
TRAINER_OWNED = Owned(
    "Kubeflow Trainer's Torch plugin and the Job controller (TrainJob: constants.TorchRunReservedEnvNames)",
    frozenset(("JOB_COMPLETION_INDEX",)),
    ("PET_",),
)


def runtime_pod(spec: JobSpec, opts: K8sOptions, domain: ComputeDomain | None, image: str) -> Pod:
    """The runtime's pod: profile, fabric and torch settings, without the per-job --env."""
    plan = build_env(dataclasses.replace(spec, env=()), compute_domain=domain is not None)
    labels = {"app.kubernetes.io/component": "trainer"}
    if domain:  # a per-job runtime: the pod-affinity selector needs the job's own label
        labels = {"app.kubernetes.io/name": spec.name, **labels}
    return pod(
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
    the_pod = runtime_pod(spec, opts, None, "")
    content = dataclasses.asdict(the_pod)
    if content.get("preflight") is None:  # names stay as they were before --preflight existed
        content.pop("preflight", None)
    content["env"] = [(v.name, v.value) for v in the_pod.env]
    content.pop("pvc_access_mode")  # a comment here; checked against each job's node count
    content["resources"] = [(r.name, r.quantity) if r.limit else (r.name, r.quantity, "request")
                            for r in the_pod.resources]
    content["runtime"] = {"gang": GANG_TIMEOUT_S if opts.gang else None, "restarts": opts.backoff_limit,
                          "ttl": opts.ttl_seconds, "api": "trainer.kubeflow.org/v1alpha1"}
    digest = hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:8]
    # profile/fabric names are file stems: keep what a Kubernetes name allows
    prefix = re.sub(r"[^a-z0-9]+", "-", f"{spec.profile.name}-{spec.fabric.name}".lower()).strip("-")[:54]
    return f"{prefix}-{digest}" if prefix else f"runtime-{digest}"


def _check_shared(spec: JobSpec, opts: K8sOptions) -> None:
    """What a shared, cluster-scoped runtime cannot hold: it belongs to each TrainJob."""
    refuse_preflight(spec)
    if spec.nodes.elastic:
        raise SpecError(
            f"--nnodes {spec.nodes.torchrun_value}: Kubeflow Trainer v2 has no elastic mode; "
            "use `launch k8s --api pytorchjob`"
        )
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


def render_job(job: Job, opts: K8sOptions) -> str:
    """The ClusterTrainingRuntime (``job.plan`` is not used: the runtime leaves --env to each job)."""
    spec = job.spec
    _check_shared(spec, opts)
    return check_manifest_size(render(
        "trainingruntime.yaml.j2",
        header=header_lines(job.command, spec),
        runtime=Runtime("ClusterTrainingRuntime", opts.runtime or default_runtime_name(spec, opts)),
        replicated_job=REPLICATED_JOB,
        gang=Gang(GANG_TIMEOUT_S) if opts.gang else None,
        opts=opts,
        namespace=None,
        pod=runtime_pod(spec, opts, None, spec.image),
        compute_domain=None,
        trainjob=None,
        name=None,
        job_labels={},
    ))


BACKEND = register(Backend(
    name="k8s-runtime",
    help="Kubeflow Trainer v2 ClusterTrainingRuntime for a profile and fabric (what TrainJobs refer to).",
    render=render_job,
    owned=owners(TRAINER_OWNED, TORCHRUN_OWNED),
    params=k8s_params,
    parse=parse_k8s,
    builder_inputs=lambda opts: {"pulls_image": "k8s", "name_rule": "dns1035", "env_names": "k8s"},
    secret_env=lambda opts: opts.secret_env,
    warnings=k8s_warnings,
    executable=False,
))
