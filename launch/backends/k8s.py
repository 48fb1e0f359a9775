"""``launch k8s``: a Kubeflow Trainer v2 ``TrainJob`` (``trainjob``) or a training-operator v1
``PyTorchJob`` (``pytorchjob``), chosen by ``--api`` (elastic jobs: PyTorchJob)."""

from __future__ import annotations

import click

from core.errors import SpecError
from launch.backends import pytorchjob, trainjob
from launch.backends.base import Job
from launch.backends.k8s_options import K8sOptions, k8s_params, k8s_warnings, parse_k8s, resolve_api
from launch.backends.registry import Backend, register
from launch.backends.runtime import TRAINER_OWNED
from launch.envnames import TORCHRUN_OWNED

API_OWNED = {"trainjob": (TRAINER_OWNED, TORCHRUN_OWNED), "pytorchjob": (pytorchjob.PYTORCHJOB_OWNED, TORCHRUN_OWNED)}


def _parse(extra: dict, job_options: dict) -> K8sOptions:
    return parse_k8s(extra, job_options)


def render_job(job: Job, opts: K8sOptions) -> str:
    api = resolve_api(job.spec, opts)
    if api == "pytorchjob":
        if opts.runtime:
            raise SpecError("--runtime names a Trainer v2 runtime; it does not apply to --api pytorchjob")
        return pytorchjob.render_job(job, opts)
    return trainjob.render_job(job, opts)


def _params() -> list:
    return [*k8s_params(), click.Option(
        ["--api"], type=click.Choice(["trainjob", "pytorchjob"]), default=None,
        help="trainjob: Kubeflow Trainer v2 TrainJob (default for fixed-size jobs); pytorchjob: "
             "training-operator v1 PyTorchJob (default for elastic MIN:MAX jobs: Trainer v2 has "
             "no elastic mode).")]


BACKEND = register(Backend(
    name="k8s",
    help="Kubeflow TrainJob (Trainer v2) or PyTorchJob (training-operator v1) manifest.",
    render=render_job,
    owned=lambda spec, opts: API_OWNED[resolve_api(spec, opts)],
    params=_params,
    parse=_parse,
    builder_inputs=lambda opts: {"pulls_image": "k8s", "name_rule": "dns1035", "env_names": "k8s"},
    secret_env=lambda opts: opts.secret_env,
    warnings=k8s_warnings,
    executable=False,
))
