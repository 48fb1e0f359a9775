"""The one input shape every backend takes: ``render_job(job: Job, opts) -> str``.

``Job`` is what all outputs share (the validated spec, its environment and the command
line recorded in the header); ``opts`` is the backend's own frozen dataclass of options
(``TorchrunOptions``, ``DockerOptions``, ``SlurmOptions``, ``K8sOptions``; ``launch env``
has none). The result is the rendered text, written by ``launch.output``.
"""

from __future__ import annotations

from dataclasses import dataclass

from launch.envplan import EnvPlan
from launch.spec import JobSpec


@dataclass(frozen=True)
class Job:
    spec: JobSpec
    plan: EnvPlan
    command: str  # the `launch ...` invocation, without -o FILE (the header's first line)
