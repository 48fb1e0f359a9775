"""``launch docker``: a bash script that runs torchrun in ``docker run`` / ``podman run`` with
what NGC containers need (engine, GPUs and locked memory are decided when it runs)."""

from __future__ import annotations

from dataclasses import dataclass

import click

from launch.backends.base import Job
from launch.backends.registry import Backend, owners, register
from launch.backends.shell import (
    RDZV_ENDPOINT,
    common_context,
    preflight_context,
    torchrun_groups,
)
from launch.commandline import out_warnings, unused_warnings
from launch.envnames import TORCHRUN_OWNED
from launch.render import render
from launch.spec import CONTAINER_NAME, JobSpec

DOCKER_BASE_FLAGS = (
    ("--rm", "remove the container when training exits"),
    ("--ipc=host", "worker processes share memory through /dev/shm (NGC requirement)"),
    ("--ulimit=stack=67108864", "64 MiB stack, as NGC PyTorch containers require"),
)


@dataclass(frozen=True)
class DockerOptions:
    cpu: bool = False  # render LAUNCH_GPUS=none as the default: CPU processes (gloo)


def docker_flags(spec: JobSpec) -> list[tuple[str, str]]:
    """Engine-independent `docker run` options; GPUs, locked memory and the user are
    decided at run time by the script (engine, rootless, LAUNCH_GPUS)."""
    flags = list(DOCKER_BASE_FLAGS)
    flags.append(
        (
            f"--stop-timeout={spec.grace_period_s}",
            (f"`{{docker,podman}} stop` and engine shutdowns wait --grace-period ({spec.grace_period_s} s) after "
             "SIGTERM before SIGKILL (default 10 s), so the preemption checkpoint can finish"),
        )
    )
    if spec.nodes.multi_node:
        flags.append(("--network=host", "rendezvous and NCCL bootstrap/socket traffic use the host's interfaces"))
    for device in spec.fabric.docker_devices:
        flags.append((f"--device={device}", f"fabric {spec.fabric.name}: RDMA verbs devices for NCCL"))
    for cap in spec.fabric.docker_cap_add:
        flags.append((f"--cap-add={cap}", f"fabric {spec.fabric.name}: NCCL registers (pins) memory for RDMA"))
    for mount in spec.mounts:
        suffix = ":" + ",".join(mount.options) if mount.options else ""
        flags.append((f"--volume={mount.source}:{mount.target}{suffix}", "--mount"))
    flags.append(
        (
            f"--volume={spec.checkpoint_dir}:{spec.checkpoint_dir}",
            "checkpoint directory (--checkpoint-dir), same path on the host and in the container",
        )
    )
    return flags


def render_job(job: Job, opts: DockerOptions = DockerOptions()) -> str:
    spec = job.spec
    ctx = common_context(job, container=True)
    ctx.update(
        image=spec.image,
        job_name=spec.name,
        container_name_re=f"^{CONTAINER_NAME.pattern}$",  # the rule --name was checked by, for the run-time override
        checkpoint_dir=spec.checkpoint_dir,
        grace_period_s=spec.grace_period_s,
        cpu=opts.cpu,
        rdma_fabric=bool(spec.fabric.docker_devices or "IPC_LOCK" in spec.fabric.docker_cap_add),
        flags=docker_flags(spec),
        torchrun_groups=torchrun_groups(spec, RDZV_ENDPOINT, spec.rdzv.id),
        **preflight_context(spec, spec.rdzv.id),
    )
    return render("docker.sh.j2", **ctx)


BACKEND = register(Backend(
    name="docker",
    help="""Bash script running torchrun in `docker run` / `podman run` with what NGC containers need.

    The script detects the engine (LAUNCH_ENGINE overrides), names the container after
    the job, creates the checkpoint directory writable for the container and passes
    LAUNCH_ENGINE_FLAGS to the engine; see docs/launch.md.
    """,
    render=render_job,
    owned=owners(TORCHRUN_OWNED),
    params=lambda: [click.Option(
        ["--cpu"], is_flag=True,
        help="CPU variant (a laptop, no GPUs): LAUNCH_GPUS=none by default, workers use gloo.")],
    parse=lambda extra, job_options: DockerOptions(cpu=extra["cpu"]),
    warnings=lambda job, opts: out_warnings(job.spec, "docker") + unused_warnings(
        job.spec, "docker", "the container takes the node's CPUs and memory", resources=False),
))
