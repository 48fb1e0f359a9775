"""torchrun argument vectors, shared by the shell backends and the Kubernetes manifest.

Tokens are plain ``str`` (user data: always quoted when rendered) or ``launch.render.Shell``
(a fragment the template author wrote, e.g. ``"$rdzv_endpoint"``, rendered as is).
"""

from __future__ import annotations

from launch.entrypoint import program_args
from launch.spec import JobSpec

TRAIN_PROGRAMS = (("-m", "train", "run"), ("--no-python", "train", "run"))


def launcher_args(spec: JobSpec, endpoint: str, rdzv_id: str) -> list[str]:
    """torchrun options for a script run by hand, by docker or by srun on each node."""
    args: list[str] = []
    if not spec.nodes.multi_node:
        args += ["--standalone", "--nnodes", "1"]
    else:
        args += [
            "--nnodes",
            spec.nodes.torchrun_value,
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            endpoint,
            "--rdzv-id",
            rdzv_id,
        ]
    args += ["--nproc-per-node", str(spec.nproc_per_node)]
    if spec.max_restarts:
        args += ["--max-restarts", str(spec.max_restarts)]
    return args


def training_args(spec: JobSpec, container: bool = False) -> list[str]:
    """Everything after the torchrun options: the program and the pass-through arguments.

    ``container``: the program runs in a container whose own file system goes with it
    (docker/podman ``--rm``, a Kubernetes pod, a pyxis/enroot job step): ``train run`` without
    ``--out`` gets :func:`container_out_dir`, on the mounted checkpoint volume; otherwise its
    run directory (checkpoints included) would be deleted with the container, and on several
    nodes each node's checkpoint shards would sit in a different container."""
    program = program_args(spec.entrypoint)
    if container and runs_train(spec) and out_arg(spec.train_args) is None:
        return [*program, "--out", container_out_dir(spec), *spec.train_args]
    return program + list(spec.train_args)


def runs_train(spec: JobSpec) -> bool:
    return tuple(program_args(spec.entrypoint)) in TRAIN_PROGRAMS


def out_arg(args: tuple[str, ...]) -> str | None:
    """The value of the last ``--out`` among the training arguments, None without one."""
    value = None
    for i, arg in enumerate(args):
        if arg == "--out" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--out="):
            value = arg[len("--out="):]
    return value


def container_out_dir(spec: JobSpec) -> str:
    """``train run --out`` in a container: the job's directory on the checkpoint volume."""
    return f"{spec.checkpoint_dir.rstrip('/')}/{spec.name}"


def out_warnings(spec: JobSpec, backend: str, mounts: bool = True) -> list[str]:
    """A ``--out`` given to ``train run`` in a container that is neither under the checkpoint
    directory nor under a writable ``--mount`` target (``mounts``: the backend renders the
    mounts; Kubernetes does not): deleted with the container."""
    out = out_arg(spec.train_args) if runs_train(spec) else None
    if out is None:
        return []
    writable = [m.target for m in spec.mounts if not m.read_only] if mounts else []
    kept = [spec.checkpoint_dir, *writable]
    path = out.rstrip("/") or "/"
    if any(path == k.rstrip("/") or path.startswith(k.rstrip("/") + "/") for k in kept):
        return []
    where = "--checkpoint-dir " + spec.checkpoint_dir + (" or a writable --mount" if mounts else "")
    return [f"{backend}: --out {out} is not under {where}: it is inside the container and deleted with it"]


def unused_warnings(spec: JobSpec, backend: str, why: str, *, mounts: bool = True, resources: bool = True,
                    endpoint_host: bool = True) -> list[str]:
    """One line naming the options given that ``backend`` does not render (``mounts``,
    ``resources``, ``endpoint_host`` False: it has no use for them), and ``why``."""
    unused = ["--mount"] if not mounts and spec.mounts else []
    if not resources:
        unused += [opt for opt, value in (("--cpus", spec.resources.cpus), ("--memory", spec.resources.memory))
                   if value is not None]
    if not endpoint_host and spec.rdzv.host is not None:
        unused.append("--rdzv-endpoint's host")
    return [f"{backend}: {', '.join(unused)} not rendered: {why}"] if unused else []


PREFLIGHT_PORT_OFFSET = 1  # the preflight's rendezvous: same host as the training's, port + 1


def preflight_train_args(spec: JobSpec) -> list[str]:
    """``-m train preflight ...``: the check every node runs before training (--preflight)."""
    busbw = spec.preflight.busbw_GBps or spec.fabric.busbw_GBps
    args = ["-m", "train", "preflight", "--min-fraction", f"{spec.preflight.min_fraction:g}"]
    if busbw:
        args += ["--expect-busbw", f"{busbw:g}"]
    return args


def preflight_launcher_args(spec: JobSpec, endpoint: str, rdzv_id: str) -> list[str]:
    """torchrun options of the preflight: the training's, one restart round only; a
    multi-node preflight meets on its own rendezvous (``endpoint``: the training's host,
    port + 1; id + "-preflight"), so that a node that finishes the check early can never
    join the preflight's store while it shuts down."""
    args = [a for a in launcher_args(spec, endpoint, rdzv_id)]
    if "--max-restarts" in args:
        i = args.index("--max-restarts")
        del args[i:i + 2]
    return args
