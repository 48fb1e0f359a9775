"""Shell backends: plain torchrun script, docker wrapper, Slurm batch script, env file."""

from __future__ import annotations

import re
from dataclasses import dataclass

from launch.commandline import Shell, launcher_args, training_args
from launch.envplan import EnvPlan
from launch.render import Quoted, group_args, header_lines, render
from launch.spec import _SAFE_TOKEN, JobSpec, SpecError, parse_safe_token

DOCKER_BASE_FLAGS = (
    ("--rm", "remove the container when training exits"),
    ("--gpus=all", "all GPUs of the node; torchrun starts one worker per GPU"),
    ("--ipc=host", "worker processes share memory through /dev/shm (NGC requirement)"),
    ("--ulimit=memlock=-1", "unlimited pinned memory for CUDA host buffers and RDMA registration"),
    ("--ulimit=stack=67108864", "64 MiB stack, as NGC PyTorch containers require"),
)


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    pyxis: bool = False

    @classmethod
    def parse(cls, partition, account, time, pyxis) -> "SlurmOptions":
        return cls(
            parse_safe_token("--partition", partition),
            parse_safe_token("--account", account),
            parse_safe_token("--time", time),
            bool(pyxis),
        )


def _common(spec: JobSpec, plan: EnvPlan, command: str) -> dict:
    return {
        "header": header_lines(command, spec),
        "env": plan.variables,
        "profile_name": spec.profile.name,
        "fabric_name": spec.fabric.name,
        "multi_node": spec.nodes.multi_node,
        "elastic": spec.nodes.elastic,
        "endpoint": f"{spec.rdzv.host}:{spec.rdzv.port}" if spec.rdzv.host else None,
        "train_groups": group_args(training_args(spec)),
    }


def _torchrun_groups(spec: JobSpec, endpoint: str, rdzv_id: str) -> list[list[str]]:
    return group_args(launcher_args(spec, endpoint, rdzv_id))


def torchrun_script(spec: JobSpec, plan: EnvPlan, command: str) -> str:
    ctx = _common(spec, plan, command)
    ctx["torchrun_groups"] = _torchrun_groups(spec, Shell('"$rdzv_endpoint"'), spec.rdzv.id)
    return render("torchrun.sh.j2", **ctx)


def docker_flags(spec: JobSpec) -> list[tuple[str, str]]:
    flags = list(DOCKER_BASE_FLAGS)
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


def docker_script(spec: JobSpec, plan: EnvPlan, command: str) -> str:
    ctx = _common(spec, plan, command)
    ctx.update(
        image=spec.image,
        flags=docker_flags(spec),
        torchrun_groups=_torchrun_groups(spec, Shell('"$rdzv_endpoint"'), spec.rdzv.id),
    )
    return render("docker.sh.j2", **ctx)


def _slurm_cpus(spec: JobSpec) -> str | None:
    cpus = spec.resources.cpus
    if cpus is not None and not re.fullmatch(r"[1-9][0-9]*", cpus):
        raise SpecError(f"--cpus {cpus!r}: Slurm needs a whole number of CPUs per node")
    return cpus


def _directive(text: str) -> Quoted:
    """An #SBATCH line is parsed by sbatch, not by bash: only plain tokens go there."""
    if not _SAFE_TOKEN.fullmatch(text):
        raise SpecError(f"#SBATCH {text!r}: only letters, digits and =^_.,:/+@- are allowed")
    return Quoted(text)


def slurm_directives(spec: JobSpec, opts: SlurmOptions) -> list[Quoted]:
    nodes = f"{spec.nodes.min}-{spec.nodes.max}" if spec.nodes.elastic else str(spec.nodes.min)
    directives = [
        f"--job-name={spec.name}",
        f"--nodes={nodes}",
        "--ntasks-per-node=1",
        f"--gpus-per-node={spec.nproc_per_node}",
        # Preemption / time limit: SIGTERM reaches every step's torchrun grace_period_s before
        # the end; torchrun forwards it and the training loop checkpoints and exits.
        f"--signal=TERM@{spec.grace_period_s}",
    ]
    cpus = _slurm_cpus(spec)
    if cpus:
        directives.append(f"--cpus-per-task={cpus}")
    for flag, value in (("partition", opts.partition), ("account", opts.account), ("time", opts.time)):
        if value:
            directives.append(f"--{flag}={value}")
    return [_directive(d) for d in directives]


def srun_flags(spec: JobSpec, opts: SlurmOptions) -> list[tuple[str, str]]:
    flags = [
        (Shell('--nodes="$SLURM_JOB_NUM_NODES"'), "every node of the allocation (elastic: however many were granted)"),
        (Shell('--ntasks="$SLURM_JOB_NUM_NODES"'), "one torchrun per node"),
        ("--ntasks-per-node=1", "torchrun itself starts --nproc-per-node workers"),
        ("--kill-on-bad-exit=1", "stop the other nodes when one torchrun fails"),
    ]
    if opts.pyxis:
        flags.append((f"--container-image={spec.image}", "pyxis/enroot: run torchrun inside the image"))
        mounts = [f"{m.source}:{m.target}{':ro' if m.read_only else ''}" for m in spec.mounts]
        mounts.append(f"{spec.checkpoint_dir}:{spec.checkpoint_dir}")
        flags.append((f"--container-mounts={','.join(mounts)}", "--mount and the checkpoint directory"))
    return flags


def slurm_script(spec: JobSpec, plan: EnvPlan, command: str, opts: SlurmOptions) -> str:
    ctx = _common(spec, plan, command)
    ctx.update(
        directives=slurm_directives(spec, opts),
        port=spec.rdzv.port,
        srun_flags=srun_flags(spec, opts),
        torchrun_groups=_torchrun_groups(spec, Shell('"$rdzv_endpoint"'), Shell('"$SLURM_JOB_ID"')),
    )
    return render("slurm.sbatch.j2", **ctx)


def env_file(spec: JobSpec, plan: EnvPlan, command: str) -> str:
    return render("env.sh.j2", **_common(spec, plan, command))
