"""``launch docker``: a bash script that runs torchrun in ``docker run`` / ``podman run`` with
what NGC containers need (engine, GPUs and locked memory are decided when it runs)."""

from __future__ import annotations

from dataclasses import dataclass

from launch.backends.base import Job
from launch.backends.shell import (
    RDZV_ENDPOINT,
    common_context,
    preflight_context,
    torchrun_groups,
)
from launch.commandline import program_args
from launch.render import group_args, render
from launch.spec import JobSpec

DOCKER_BASE_FLAGS = (
    ("--rm", "remove the container when training exits"),
    ("--ipc=host", "worker processes share memory through /dev/shm (NGC requirement)"),
    ("--ulimit=stack=67108864", "64 MiB stack, as NGC PyTorch containers require"),
)
TRAIN_PROGRAMS = (("-m", "train", "run"), ("--no-python", "train", "run"))


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
        suffix = ":ro" if mount.read_only else ""
        flags.append((f"--volume={mount.source}:{mount.target}{suffix}", "--mount"))
    flags.append(
        (
            f"--volume={spec.checkpoint_dir}:{spec.checkpoint_dir}",
            "checkpoint directory (--checkpoint-dir), same path on the host and in the container",
        )
    )
    return flags


def _train_program(spec: JobSpec) -> bool:
    return tuple(program_args(spec.entrypoint)) in TRAIN_PROGRAMS


def _out_arg(args: tuple[str, ...]) -> str | None:
    value = None
    for i, arg in enumerate(args):
        if arg == "--out" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--out="):
            value = arg[len("--out="):]
    return value


def docker_out_dir(spec: JobSpec) -> str:
    """`train run --out` for a container: under the checkpoint volume (the container's
    own /workspace is deleted with it by --rm)."""
    return f"{spec.checkpoint_dir.rstrip('/')}/{spec.name}"


def docker_warnings(spec: JobSpec) -> list[str]:
    out = _out_arg(spec.train_args) if _train_program(spec) else None
    if out is None:
        return []
    kept = [spec.checkpoint_dir] + [m.target for m in spec.mounts if not m.read_only]
    path = out.rstrip("/") or "/"
    if not any(path == k.rstrip("/") or path.startswith(k.rstrip("/") + "/") for k in kept):
        return [(f"docker: --out {out} is not under --checkpoint-dir {spec.checkpoint_dir} or a writable "
                 "--mount: it is inside the container and deleted with it (--rm)")]
    return []


def render_job(job: Job, opts: DockerOptions = DockerOptions()) -> str:
    spec = job.spec
    ctx = common_context(job)
    if _train_program(spec) and _out_arg(spec.train_args) is None:
        program = program_args(spec.entrypoint)
        ctx["train_groups"] = group_args([*program, "--out", docker_out_dir(spec), *spec.train_args])
    ctx.update(
        image=spec.image,
        job_name=spec.name,
        checkpoint_dir=spec.checkpoint_dir,
        grace_period_s=spec.grace_period_s,
        cpu=opts.cpu,
        rdma_fabric=bool(spec.fabric.docker_devices or "IPC_LOCK" in spec.fabric.docker_cap_add),
        flags=docker_flags(spec),
        torchrun_groups=torchrun_groups(spec, RDZV_ENDPOINT, spec.rdzv.id),
        **preflight_context(spec, spec.rdzv.id),
    )
    return render("docker.sh.j2", **ctx)
