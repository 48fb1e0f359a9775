"""``launch torchrun`` (and ``launch run``): a bash script that runs torchrun on this node,
standalone or on a c10d rendezvous shared by every node."""

from __future__ import annotations

from dataclasses import dataclass

import click

from launch.backends.base import Job
from launch.backends.registry import Backend, owners, register
from launch.backends.shell import (
    RDZV_ENDPOINT,
    common_context,
    parse_venv,
    preflight_context,
    torchrun_groups,
)
from launch.commandline import unused_warnings
from launch.envnames import TORCHRUN_OWNED
from launch.render import render


@dataclass(frozen=True)
class TorchrunOptions:
    venv: str | None = None  # put DIR/bin (torchrun, python) first on PATH

    @classmethod
    def parse(cls, venv: str | None = None) -> TorchrunOptions:
        return cls(parse_venv(venv))


def render_job(job: Job, opts: TorchrunOptions = TorchrunOptions()) -> str:
    spec = job.spec
    ctx = common_context(job)
    ctx.update(venv=opts.venv, pyxis=False, slurm=False)
    ctx["torchrun_groups"] = torchrun_groups(spec, RDZV_ENDPOINT, spec.rdzv.id)
    ctx.update(preflight_context(spec, spec.rdzv.id))
    return render("torchrun.sh.j2", **ctx)


def venv_param() -> click.Option:
    return click.Option(["--venv"], default=None, metavar="DIR",
                        help="Virtual environment whose bin/ (torchrun, python) the script puts first on PATH.")


BACKEND = register(Backend(
    name="torchrun",
    help="Bash script running torchrun (standalone, or c10d rendezvous on every node).",
    render=render_job,
    owned=owners(TORCHRUN_OWNED),
    params=lambda: [venv_param()],
    parse=lambda extra, job_options: TorchrunOptions.parse(extra["venv"]),
    warnings=lambda job, opts: unused_warnings(job.spec, "torchrun", "the script runs on the node itself, with no "
                                               "container or scheduler to give them to", mounts=False, resources=False),
))
