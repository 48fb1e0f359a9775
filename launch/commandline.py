"""torchrun argument vectors, shared by the shell backends and the Kubernetes manifest.

Tokens are plain ``str`` (user data: always quoted when rendered) or ``launch.render.Shell``
(a fragment the template author wrote, e.g. ``"$rdzv_endpoint"``, rendered as is).
"""

from __future__ import annotations

from pathlib import PurePosixPath

from launch.spec import JobSpec

PYTHONS = ("python", "python3")


def program_args(entrypoint: tuple[str, ...]) -> list[str]:
    """How torchrun starts the training program.

    ``python -m pkg ...`` -> ``-m pkg ...`` and ``python script.py ...`` -> ``script.py ...``
    (torchrun runs them with its own interpreter); anything else runs as a plain
    executable through ``--no-python``.
    """
    head, rest = entrypoint[0], list(entrypoint[1:])
    if PurePosixPath(head).name in PYTHONS and rest:
        if rest[0] == "-m" and len(rest) >= 2:
            return ["-m", *rest[1:]]
        if rest[0].endswith(".py"):
            return rest
    return ["--no-python", *entrypoint]


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


def training_args(spec: JobSpec) -> list[str]:
    """Everything after the torchrun options: the program and the pass-through arguments."""
    return program_args(spec.entrypoint) + list(spec.train_args)


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
