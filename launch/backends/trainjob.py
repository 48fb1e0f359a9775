"""``launch k8s --api trainjob``: a Kubeflow Trainer v2 ``TrainJob`` together with the
``TrainingRuntime`` it names (one multi-document file, applied together: the reference cannot
dangle), and the ComputeDomain where the profile needs one (see ``k8s_pod``); or, with
``--runtime NAME``, the TrainJob alone naming the ``ClusterTrainingRuntime`` kept under that
name (``launch k8s-runtime --runtime NAME``)."""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import SpecError
from launch.backends.base import Job
from launch.backends.k8s_options import K8sOptions
from launch.backends.k8s_pod import (
    GANG_TIMEOUT_S,
    GPU_RESOURCE,
    Gang,
    Resource,
    Runtime,
    check_checkpoint_claim,
    check_manifest_size,
    check_unique_pod_env,
    compute_domain,
    cpu_memory,
    job_labels,
    refuse_preflight,
)
from launch.backends.runtime import REPLICATED_JOB, runtime_pod
from launch.commandline import training_args
from launch.render import header_lines, render
from launch.spec import JobSpec


@dataclass(frozen=True)
class TrainJobSpec:
    image: str
    args: tuple
    num_nodes: int
    nproc: int
    env: tuple
    secret_env: tuple
    resources: tuple  # Resource entries: the GPUs and what --cpus / --memory override
    runtime_why: str


def _check_trainjob(spec: JobSpec, opts: K8sOptions) -> None:
    refuse_preflight(spec)
    check_checkpoint_claim(spec, opts)  # also with --runtime, where no pod is rendered here
    # JobSet's webhook: <jobset>-<replicatedJob>-<job index>-<pod index> plus the pod's
    # 5-character random suffix must be a DNS-1035 label (jobset pkg/webhooks/jobset_webhook.go)
    longest = f"{spec.name}-{REPLICATED_JOB}-0-{spec.nodes.max - 1}-xxxxx"
    if len(longest) > 63:
        raise SpecError(
            f"--name {spec.name!r} is too long for Kubernetes: JobSet's pod name "
            f"{longest!r} would exceed 63 characters"
        )
    # the names the Trainer and torchrun own (PET_*...): runtime.TRAINER_OWNED, checked by the CLI


def render_job(job: Job, opts: K8sOptions) -> str:
    spec = job.spec
    check_unique_pod_env(job.plan, opts)
    _check_trainjob(spec, opts)
    domain = compute_domain(spec, opts)
    if domain and opts.runtime:
        raise SpecError("--runtime: a job with a ComputeDomain brings its own TrainingRuntime")
    if opts.runtime:
        runtime = Runtime("ClusterTrainingRuntime", opts.runtime)
        why = (f"--runtime {opts.runtime}: the ClusterTrainingRuntime kept under this name; render it with "
               "`launch k8s-runtime --runtime` and the same name, profile, fabric and options")
    else:
        runtime = Runtime("TrainingRuntime", spec.name)
        why = ("the job's own TrainingRuntime (above, applied with this job, so the reference always resolves): "
               f"profile {spec.profile.name} + fabric {spec.fabric.name}"
               + (", the ComputeDomain's IMEX channel claim and the NVLink-domain affinity" if domain else ""))
    trainjob = TrainJobSpec(
        image=spec.image,
        args=tuple(training_args(spec, container=True)),
        num_nodes=spec.nodes.max,
        nproc=spec.nproc_per_node,
        env=spec.env,
        secret_env=opts.secret_env,
        resources=(Resource(GPU_RESOURCE, str(spec.nproc_per_node), None), *cpu_memory(spec, profile=False)),
        runtime_why=why,
    )
    context = {"header": header_lines(job.command, spec), "name": spec.name, "namespace": opts.namespace,
               "replicated_job": REPLICATED_JOB,
               "job_labels": job_labels(spec, opts), "trainjob": trainjob, "runtime": runtime}
    if opts.runtime:
        return check_manifest_size(render("trainjob.yaml.j2", **context))
    return check_manifest_size(render(
        "trainingruntime.yaml.j2", **context,
        gang=Gang(GANG_TIMEOUT_S) if opts.gang else None,
        opts=opts,
        pod=runtime_pod(spec, opts, domain, spec.image),
        compute_domain=domain,
    ))
