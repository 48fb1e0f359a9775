"""``launch env``: the job's environment alone, as commented ``export NAME=VALUE`` lines."""

from __future__ import annotations

from launch.backends.base import Job
from launch.backends.shell import common_context
from launch.render import render


def render_job(job: Job) -> str:
    return render("env.sh.j2", **common_context(job))
