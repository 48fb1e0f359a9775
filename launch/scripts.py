"""Shell backends: plain torchrun script, docker wrapper, Slurm batch script, env file."""

from __future__ import annotations

import re
from dataclasses import dataclass

from launch.commandline import (
    Shell,
    launcher_args,
    preflight_launcher_args,
    preflight_train_args,
    program_args,
    training_args,
)
from launch.envplan import EnvPlan
from launch.errors import SpecError
from launch.render import Quoted, group_args, header_lines, render
from launch.spec import _SAFE_TOKEN, JobSpec, parse_safe_token, reject_control_chars

DOCKER_BASE_FLAGS = (
    ("--rm", "remove the container when training exits"),
    ("--ipc=host", "worker processes share memory through /dev/shm (NGC requirement)"),
    ("--ulimit=stack=67108864", "64 MiB stack, as NGC PyTorch containers require"),
)
TRAIN_PROGRAMS = (("-m", "train", "run"), ("--no-python", "train", "run"))


@dataclass(frozen=True)
class DockerOptions:
    cpu: bool = False  # render LAUNCH_GPUS=none as the default: CPU processes (gloo)


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    pyxis: bool = False
    gpu_gres: str | None = "gpu"  # None: request no GPUs (CPU-only cluster)
    venv: str | None = None

    @classmethod
    def parse(cls, partition, account, time, pyxis, gpu_gres="gpu", venv=None) -> "SlurmOptions":
        if pyxis and venv:
            raise SpecError("--venv and --pyxis exclude each other: with pyxis, torchrun comes from --image")
        return cls(
            parse_safe_token("--partition", partition),
            parse_safe_token("--account", account),
            parse_safe_token("--time", time),
            bool(pyxis),
            parse_gres(gpu_gres),
            parse_venv(venv),
        )


_GRES = re.compile(r"[A-Za-z][A-Za-z0-9_-]*(:[A-Za-z0-9_.-]+)?")


def parse_gres(value: str | None) -> str | None:
    """``gpu`` (--gpus-per-node), another GRES name/type such as ``gpu:h100`` (--gres), or ``none``."""
    if value is None or value == "none":
        return None
    if not _GRES.fullmatch(value):
        raise SpecError(f"--gpu-gres {value!r}: a GRES name such as gpu or gpu:h100, or none")
    return value


def parse_venv(value: str | None) -> str | None:
    """A virtual environment directory; it lands in PATH, so no ':' there."""
    if value is None:
        return None
    reject_control_chars("--venv", value)
    if not value.startswith("/") or ":" in value:
        raise SpecError(f"--venv {value!r}: an absolute directory path without ':'")
    return value.rstrip("/") or "/"


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


def _preflight(spec: JobSpec, rdzv_id) -> dict:
    """Template context of --preflight (empty when off)."""
    if not spec.preflight.enabled:
        return {"preflight": None}
    # a shell expression such as "$SLURM_JOB_ID" gets the suffix inside its quotes
    pid = Shell(rdzv_id[:-1] + '-preflight"') if isinstance(rdzv_id, Shell) else f"{rdzv_id}-preflight"
    busbw = spec.preflight.busbw_GBps or spec.fabric.busbw_GBps
    source = ("--preflight-busbw" if spec.preflight.busbw_GBps else
              f"fabric {spec.fabric.name}: {spec.fabric.busbw_why}" if spec.fabric.busbw_GBps else
              "no declared busbw: nodes are compared with each other")
    return {"preflight": {
        "torchrun_groups": group_args(preflight_launcher_args(spec, Shell('"$preflight_endpoint"'), pid)),
        "train_groups": group_args(preflight_train_args(spec)),
        "expect": f"{busbw:g} GB/s ({source})" if busbw else source,
        "fraction": f"{spec.preflight.min_fraction:g}",
    }}


def torchrun_script(spec: JobSpec, plan: EnvPlan, command: str, venv: str | None = None) -> str:
    ctx = _common(spec, plan, command)
    ctx.update(venv=venv, pyxis=False, slurm=False)
    ctx["torchrun_groups"] = _torchrun_groups(spec, Shell('"$rdzv_endpoint"'), spec.rdzv.id)
    ctx.update(_preflight(spec, spec.rdzv.id))
    return render("torchrun.sh.j2", **ctx)


def docker_flags(spec: JobSpec) -> list[tuple[str, str]]:
    """Engine-independent `docker run` options; GPUs, locked memory and the user are
    decided at run time by the script (engine, rootless, LAUNCH_GPUS)."""
    flags = list(DOCKER_BASE_FLAGS)
    flags.append(
        (
            f"--stop-timeout={spec.grace_period_s}",
            f"`{{docker,podman}} stop` and engine shutdowns wait --grace-period ({spec.grace_period_s} s) after "
            "SIGTERM before SIGKILL (default 10 s), so the preemption checkpoint can finish",
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
        return [f"docker: --out {out} is not under --checkpoint-dir {spec.checkpoint_dir} or a writable "
                "--mount: it is inside the container and deleted with it (--rm)"]
    return []


def docker_script(spec: JobSpec, plan: EnvPlan, command: str, opts: DockerOptions = DockerOptions()) -> str:
    ctx = _common(spec, plan, command)
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
        torchrun_groups=_torchrun_groups(spec, Shell('"$rdzv_endpoint"'), spec.rdzv.id),
        **_preflight(spec, spec.rdzv.id),
    )
    return render("docker.sh.j2", **ctx)


def slurm_cpus(spec: JobSpec) -> int:
    """CPUs per node (= per task, one task per node): --cpus, else the profile's cpus_per_node,
    else 4 per process (the OMP_NUM_THREADS the profiles set)."""
    cpus = spec.resources.cpus
    if cpus is not None:
        if not re.fullmatch(r"[1-9][0-9]*", cpus):
            raise SpecError(f"--cpus {cpus!r}: Slurm needs a whole number of CPUs per node")
        return int(cpus)
    return spec.profile.cpus_per_node or 4 * spec.nproc_per_node


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


def slurm_memory(quantity: str) -> str:
    """A Kubernetes memory quantity (512Gi, 64G, 1.5Ti) as Slurm --mem (binary units, rounded up)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([A-Za-z]*)", quantity)
    unit = match.group(2) if match else "?"
    scale = _BINARY.get(unit) or _DECIMAL.get(unit)
    if not scale:
        raise SpecError(f"--memory {quantity!r}: Slurm needs bytes, e.g. 512Gi, 64G or 500Mi")
    value = float(match.group(1)) * scale
    for suffix, size in (("T", 2**40), ("G", 2**30), ("M", 2**20)):
        if value >= size and value % size == 0:
            return f"{int(value // size)}{suffix}"
    return f"{max(1, -(-int(value) // 2**20))}M"


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
        f"--cpus-per-task={slurm_cpus(spec)}",
    ]
    if opts.gpu_gres == "gpu":
        directives.append(f"--gpus-per-node={spec.nproc_per_node}")
    elif opts.gpu_gres:
        directives.append(f"--gres={opts.gpu_gres}:{spec.nproc_per_node}")
    if spec.resources.memory:
        directives.append(f"--mem={slurm_memory(spec.resources.memory)}")
    directives += [
        # Preemption / time limit: SIGTERM reaches every process of the steps grace_period_s
        # before the end; the training processes checkpoint, the script requeues the job.
        f"--signal=TERM@{spec.grace_period_s}",
        "--requeue",
        # One log per job: every attempt (requeue) appends to it after its own header line.
        "--open-mode=append",
        Quoted("--output=%x-%j.out"),  # a constant: %x job name, %j job id (sbatch patterns)
    ]
    for flag, value in (("partition", opts.partition), ("account", opts.account), ("time", opts.time)):
        if value:
            directives.append(f"--{flag}={value}")
    return [d if isinstance(d, Quoted) else _directive(d) for d in directives]


def srun_flags(spec: JobSpec, opts: SlurmOptions) -> list[tuple[str, str]]:
    flags = [
        (Shell('--nodes="$SLURM_JOB_NUM_NODES"'), "every node of the allocation (elastic: however many were granted)"),
        (Shell('--ntasks="$SLURM_JOB_NUM_NODES"'), "one torchrun per node"),
        ("--ntasks-per-node=1", "torchrun itself starts --nproc-per-node workers"),
        ("--kill-on-bad-exit=1", "stop the other nodes when one torchrun fails"),
        (Shell('--cpus-per-task="${SLURM_CPUS_PER_TASK:-1}"'),
         "the job's CPUs for each task: srun >= 22.05 does not inherit --cpus-per-task from sbatch"),
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
        venv=opts.venv,
        pyxis=opts.pyxis,
        slurm=True,
        port=spec.rdzv.port,
        srun_flags=srun_flags(spec, opts),
        torchrun_groups=_torchrun_groups(spec, Shell('"$rdzv_endpoint"'), Shell('"$SLURM_JOB_ID"')),
        **_preflight(spec, Shell('"$SLURM_JOB_ID"')),
    )
    return render("slurm.sbatch.j2", **ctx)


def env_file(spec: JobSpec, plan: EnvPlan, command: str) -> str:
    return render("env.sh.j2", **_common(spec, plan, command))
