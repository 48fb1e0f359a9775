"""``launch env``: the job's environment alone, as commented ``export NAME=VALUE`` lines."""

from __future__ import annotations

from launch.backends.base import Job
from launch.backends.registry import Backend, owners, register
from launch.backends.shell import common_context
from launch.envnames import TORCHRUN_OWNED
from launch.render import render


def render_job(job: Job, opts: None = None) -> str:
    return render("env.sh.j2", **common_context(job))


BACKEND = register(Backend(
    name="env",
    help="The environment alone, as commented `export NAME=VALUE` lines.",
    render=render_job,
    owned=owners(TORCHRUN_OWNED),  # exports for a torchrun started by hand
    executable=False,
))
