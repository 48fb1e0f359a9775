"""What the bash outputs share (torchrun, docker, Slurm, env): the template context of the
header, environment and torchrun command, and the ``--preflight`` round before training.

Values stay plain ``str`` (quoted by ``launch.render``) or ``Shell`` (the templates' own
variables such as ``"$rdzv_endpoint"``).
"""

from __future__ import annotations

from core.errors import SpecError
from core.homepath import refuse_home
from core.safety import excerpt
from launch.backends.base import Job
from launch.commandline import (
    launcher_args,
    preflight_launcher_args,
    preflight_train_args,
    training_args,
)
from launch.render import Shell, group_args, header_lines
from launch.spec import JobSpec, reject_control_chars, reject_long_names

RDZV_ENDPOINT = Shell('"$rdzv_endpoint"')  # set by the script from --rdzv-endpoint or the node list


def parse_venv(value: str | None) -> str | None:
    """A virtual environment directory; it lands in PATH, so no ':' there."""
    if value is None:
        return None
    reject_control_chars("--venv", value)
    reject_long_names("--venv", value)
    refuse_home(value, "--venv", SpecError)
    if not value.startswith("/") or ":" in value:
        raise SpecError(f"--venv {excerpt(value)}: an absolute directory path without ':'")
    return value.rstrip("/") or "/"


def common_context(job: Job, container: bool = False) -> dict:
    """What every shell template needs; ``container``: the training runs in a container
    (:func:`launch.commandline.training_args`)."""
    spec = job.spec
    return {
        "header": header_lines(job.command, spec),
        "env": job.plan.variables,
        "profile_name": spec.profile.name,
        "fabric_name": spec.fabric.name,
        "multi_node": spec.nodes.multi_node,
        "elastic": spec.nodes.elastic,
        "endpoint": f"{spec.rdzv.host}:{spec.rdzv.port}" if spec.rdzv.host else None,
        "train_groups": group_args(training_args(spec, container)),
    }


def torchrun_groups(spec: JobSpec, endpoint: str, rdzv_id: str) -> list[list[str]]:
    return group_args(launcher_args(spec, endpoint, rdzv_id))


def preflight_context(spec: JobSpec, rdzv_id) -> dict:
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
