"""``launch slurm``: an sbatch script, one task per node running torchrun (directly, from a
virtual environment, or inside the image with pyxis/enroot), rendezvous on the first node."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal

import click

from core import limits
from core.errors import SpecError
from launch import defaults
from launch.backends.base import Job
from launch.backends.registry import Backend, register
from launch.backends.shell import (
    RDZV_ENDPOINT,
    common_context,
    parse_venv,
    preflight_context,
    torchrun_groups,
)
from launch.backends.torchrun import venv_param
from launch.commandline import out_warnings, unused_warnings
from launch.envnames import TORCHRUN_OWNED, Owned
from launch.images import registry_host
from launch.render import Quoted, Shell, render
from launch.spec import PROPAGATION, SAFE_TOKEN, JobSpec, parse_safe_token, quantity_value

SLURM_JOB_ID = Shell('"$SLURM_JOB_ID"')  # the rendezvous id of every attempt of the job
SLURM_OWNED = Owned(
    "Slurm (sbatch and srun set or read them; the script uses them for srun, the rendezvous id and "
    "scontrol/scancel)",
    frozenset(),
    ("SLURM_", "SLURMD_", "SRUN_", "SBATCH_", "SALLOC_"),
)


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    pyxis: bool = False
    gpu_gres: str | None = defaults.SLURM_GPU_GRES  # None: request no GPUs (CPU-only cluster)
    venv: str | None = None
    node_resources: str = defaults.SLURM_NODE_RESOURCES  # node: whole nodes; profile: the profile's CPUs
    exclusive: bool = False  # --exclusive with --node-resources profile (node implies it)
    requeue: bool = True  # --no-requeue: a stopped job ends; no `scontrol requeue`

    @classmethod
    def parse(cls, partition, account, time, pyxis, gpu_gres=defaults.SLURM_GPU_GRES, venv=None,
              node_resources=defaults.SLURM_NODE_RESOURCES, exclusive=False, requeue=True) -> SlurmOptions:
        if pyxis and venv:
            raise SpecError("--venv and --pyxis exclude each other: with pyxis, torchrun comes from --image")
        return cls(
            parse_safe_token("--partition", partition),
            parse_safe_token("--account", account),
            parse_time(time),
            bool(pyxis),
            parse_gres(gpu_gres),
            parse_venv(venv),
            node_resources,
            bool(exclusive or node_resources == "node"),
            bool(requeue),
        )


# sbatch --time: MIN, MIN:SEC, H:MIN:SEC, D-H, D-H:MIN, D-H:MIN:SEC, or no limit.
_TIME = re.compile(r"[0-9]{1,8}(:[0-9]{1,8}){0,2}|[0-9]{1,5}-[0-9]{1,8}(:[0-9]{1,8}){0,2}|INFINITE|UNLIMITED",
                   re.ASCII | re.IGNORECASE)


def parse_time(value: str | None) -> str | None:
    if value is not None and not _TIME.fullmatch(value):
        raise SpecError(f"--time {value!r}: a Slurm time limit such as 90, 24:00:00 or 2-12:00:00")
    return value


def time_limit_s(value: str | None) -> int | None:
    """An sbatch --time in seconds (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS); None for no
    limit (UNLIMITED, INFINITE, 0 or no --time)."""
    if value is None or value.upper() in ("UNLIMITED", "INFINITE"):
        return None
    days, _, clock = value.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days:  # D-HH, D-HH:MM, D-HH:MM:SS
        hours, minutes, seconds = (parts + [0, 0])[:3]
        hours += int(days) * 24
    elif len(parts) == 3:  # HH:MM:SS
        hours, minutes, seconds = parts
    else:  # MM, MM:SS
        hours, minutes, seconds = 0, parts[0], (parts + [0])[1]
    return (hours * 60 + minutes) * 60 + seconds or None  # 0: no time limit


SIGNAL_MAX_S = 65535  # sbatch --signal=SIG@TIME takes TIME up to 65535 s


def check_grace(spec: JobSpec, opts: SlurmOptions) -> None:
    """--signal=TERM@grace must be something sbatch takes and fit in the time limit (a grace period
    as long as the job would send SIGTERM at its start)."""
    grace = spec.grace_period_s
    if grace > SIGNAL_MAX_S:
        raise SpecError(f"--grace-period {grace}: Slurm's --signal takes at most {SIGNAL_MAX_S} seconds")
    limit = time_limit_s(opts.time)
    if limit is not None and grace >= limit:
        hint = (f"pass a shorter one, e.g. --grace-period {max(30, limit // 5)}" if limit > 30
                else "the shortest is 30 s: give a longer --time")
        raise SpecError(f"--grace-period {grace}: not shorter than --time {opts.time} ({limit} s); the job would "
                        f"get its stop signal before it could train; {hint}")


_GRES = re.compile(r"[A-Za-z][A-Za-z0-9_-]*(:[A-Za-z0-9_.-]+)?")


def parse_gres(value: str | None) -> str | None:
    """``gpu`` (--gpus-per-node), another GRES name/type such as ``gpu:h100`` (--gres), or ``none``."""
    if value is None or value == "none":
        return None
    if not _GRES.fullmatch(value):
        raise SpecError(f"--gpu-gres {value!r}: a GRES name such as gpu or gpu:h100, or none")
    return value


def slurm_cpus(spec: JobSpec, opts: SlurmOptions | None = None) -> int | None:
    """CPUs per node (= per task, one task per node): --cpus; else with --node-resources profile the
    profile's cpus_per_node or 4 per process (the OMP_NUM_THREADS the profiles set); else None (the
    whole node, --exclusive: srun's tasks get every CPU the allocation has)."""
    cpus = spec.resources.cpus
    if cpus is None and opts is not None and opts.node_resources == "node":
        return None
    if cpus is not None:
        if not re.fullmatch(r"[1-9][0-9]*", cpus):
            raise SpecError(f"--cpus {cpus!r}: Slurm needs a whole number of CPUs per node")
        if int(cpus) > limits.MAX_CPUS_PER_NODE:
            raise SpecError(f"--cpus {cpus!r}: Slurm takes at most {limits.MAX_CPUS_PER_NODE} CPUs per task")
        return int(cpus)
    return spec.profile.cpus_per_node or 4 * spec.nproc_per_node


_SLURM_UNIT = {"K": "K", "Ki": "K", "k": "K", "M": "M", "Mi": "M", "G": "G", "Gi": "G", "T": "T", "Ti": "T"}
_SLURM_SIZES = (("T", 2**40), ("G", 2**30), ("M", 2**20), ("K", 2**10))


def slurm_memory(quantity: str) -> str:
    """--memory as sbatch --mem, in the unit the user wrote: 512G and 512Gi are --mem=512G (sbatch's
    K/M/G/T are binary units, sbatch(1)); 0 is --mem=0, all of each node's memory. Anything else (a
    fraction, a decimal exponent, a bare byte count, a unit sbatch lacks: P, E) is its bytes in the
    largest whole binary unit, rounded up to whole MiB; sbatch's letters are binary, so 500M is
    read as sbatch reads it, 500 MiB. A quantity below a byte (n, u, m) is refused."""
    if quantity == "0":
        return "0"
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", quantity)
    unit = match.group(2) if match else ""
    if unit in ("n", "u", "m"):
        raise SpecError(f"--memory {quantity!r}: Slurm needs bytes, e.g. 512G, 512Gi, 500Mi or 0 (all of the node's)")
    if match and unit in _SLURM_UNIT and "." not in match.group(1):
        return f"{int(match.group(1))}{_SLURM_UNIT[unit]}"
    if match and unit:  # a fraction of a unit, or P / E: the letter read as sbatch reads it (binary)
        value = Decimal(match.group(1)) * 2 ** (10 * ("KMGTPE".index(unit[0].upper()) + 1))
    else:  # a bare byte count or a decimal exponent: bytes
        value = quantity_value(quantity)
    value = math.ceil(value)  # an int: Decimal's // truncates towards zero
    for suffix, size in _SLURM_SIZES:
        if value >= size and value % size == 0:
            return f"{value // size}{suffix}"
    return f"{max(1, -(-value // 2**20))}M"


def _directive(text: str) -> Quoted:
    """An #SBATCH line is parsed by sbatch, not by bash: only plain tokens go there."""
    if not SAFE_TOKEN.fullmatch(text):
        raise SpecError(f"#SBATCH {text!r}: only letters, digits and =^_.,:/+@- are allowed")
    return Quoted(text)


def slurm_directives(spec: JobSpec, opts: SlurmOptions) -> list[Quoted]:
    check_grace(spec, opts)
    nodes = f"{spec.nodes.min}-{spec.nodes.max}" if spec.nodes.elastic else str(spec.nodes.min)
    directives = [f"--job-name={spec.name}", f"--nodes={nodes}", "--ntasks-per-node=1"]
    cpus = slurm_cpus(spec, opts)
    if cpus is not None:
        directives.append(f"--cpus-per-task={cpus}")
    if opts.exclusive:
        directives.append("--exclusive")
    if opts.gpu_gres == defaults.SLURM_GPU_GRES:
        directives.append(f"--gpus-per-node={spec.nproc_per_node}")
    elif opts.gpu_gres:
        directives.append(f"--gres={opts.gpu_gres}:{spec.nproc_per_node}")
    if spec.resources.memory:
        directives.append(f"--mem={slurm_memory(spec.resources.memory)}")
    elif opts.node_resources == "node":
        directives.append("--mem=0")  # all of each node's memory (sbatch(1))
    directives += [
        # Preemption / time limit: SIGTERM reaches every process of the steps grace_period_s
        # before the end; the training processes checkpoint, the script requeues the job.
        f"--signal=TERM@{spec.grace_period_s}",
        "--requeue" if opts.requeue else "--no-requeue",
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
        (Shell('--cpus-per-task="$task_cpus"'),
         "the job's CPUs for each task: srun >= 22.05 does not inherit --cpus-per-task from sbatch"),
    ]
    if opts.pyxis:
        flags.append((f"--container-image={enroot_image(spec.image)}",
                      "pyxis/enroot: run torchrun inside the image (enroot's [USER@][REGISTRY#]IMAGE[:TAG])"))
        # pyxis: SRC:DST[:FLAGS], the flags (mount(8)'s: access, propagation) joined with '+'
        enroot_flags = {"ro", "rw", *PROPAGATION}
        for m in spec.mounts:
            if set(m.options) - enroot_flags:
                raise SpecError(f"--mount {m.source}:{m.target}:{','.join(m.options)}: pyxis/enroot mounts take ro, rw "
                                "and a propagation only (SELinux relabel z/Z and cached/delegated are docker/podman's)")
        mounts = [f"{m.source}:{m.target}{':' + '+'.join(m.options) if m.options else ''}" for m in spec.mounts]
        mounts.append(f"{spec.checkpoint_dir}:{spec.checkpoint_dir}")
        flags.append((f"--container-mounts={','.join(mounts)}", "--mount and the checkpoint directory"))
    return flags


def enroot_image(image: str) -> str:
    """An OCI reference ``HOST/PATH:TAG`` in enroot's form ``HOST#PATH:TAG``: enroot reads a
    reference without '#' as a Docker Hub path (``docker://[USER@][REGISTRY#]IMAGE[:TAG]``,
    enroot doc/cmd/import.md). Enroot forms, files and short names stay as given."""
    host = registry_host(image)
    if host is None or host == "file" or "#" in image:
        return image
    return f"{host}#{image[len(host) + 1:]}"


def digest_warnings(image: str) -> list[str]:
    """enroot reads an image digest (``@sha256:...``) from version 4.0 on; older ones refuse the
    reference ("Invalid image reference") when the job starts."""
    if "@" not in image.rpartition("/")[2]:
        return []
    return ["slurm --pyxis: the image is named by its digest, which enroot reads from version 4.0 on "
            "(older enroot stops the job with 'Invalid image reference'); name a tag there instead"]


def render_job(job: Job, opts: SlurmOptions = SlurmOptions()) -> str:
    spec = job.spec
    ctx = common_context(job, container=opts.pyxis)
    ctx.update(
        directives=slurm_directives(spec, opts),
        venv=opts.venv,
        pyxis=opts.pyxis,
        slurm=True,
        port=spec.rdzv.port,
        srun_flags=srun_flags(spec, opts),
        torchrun_groups=torchrun_groups(spec, RDZV_ENDPOINT, SLURM_JOB_ID),
        **preflight_context(spec, SLURM_JOB_ID),
        requeue=opts.requeue,
    )
    return render("slurm.sbatch.j2", **ctx)


def _params() -> list:
    return [
        click.Option(["--partition"], default=None),
        click.Option(["--account"], default=None),
        click.Option(["--time"], default=None, help="Wall-clock limit, Slurm syntax (e.g. 24:00:00)."),
        click.Option(["--node-resources"], type=click.Choice(["node", "profile"]),
                     default=defaults.SLURM_NODE_RESOURCES, show_default=True,
                     help="node: whole nodes (--exclusive, --mem=0, every CPU of the node), schedulable on any "
                          "node of the partition; profile: --cpus-per-task from the profile's reference node. "
                          "--cpus/--memory override either."),
        click.Option(["--exclusive"], is_flag=True, help="sbatch --exclusive (implied by --node-resources node)."),
        click.Option(["--requeue/--no-requeue"], default=True, show_default=True,
                     help="After a preemption or time-limit stop (checkpoint written), requeue the job; "
                          "--no-requeue: it ends and you resubmit."),
        click.Option(["--pyxis"], is_flag=True, help="Run inside --image with pyxis/enroot (srun --container-image)."),
        click.Option(["--gpu-gres"], default=defaults.SLURM_GPU_GRES, show_default=True, metavar="NAME|none",
                     help="GPU request: gpu (--gpus-per-node), another GRES such as gpu:h100 (--gres), "
                          "or none (CPU-only cluster)."),
        venv_param(),
    ]


BACKEND = register(Backend(
    name="slurm",
    help="sbatch script: one task per node running torchrun, rendezvous on the first node.",
    render=render_job,
    owned=lambda spec, opts: (SLURM_OWNED, TORCHRUN_OWNED),
    params=_params,
    parse=lambda extra, job_options: SlurmOptions.parse(**extra),
    builder_inputs=lambda opts: ({"image_syntax": "enroot", "pulls_image": "slurm --pyxis"} if opts.pyxis
                                 else {"image_syntax": "oci"}),
    warnings=lambda job, opts: (out_warnings(job.spec, "slurm --pyxis") + digest_warnings(job.spec.image)
                                if opts.pyxis else []) + unused_warnings(
        job.spec, "slurm", "the rendezvous is on the allocation's first node"
        + ("" if opts.pyxis else "; mounts need a container (--pyxis)"), mounts=opts.pyxis, endpoint_host=False),
))
