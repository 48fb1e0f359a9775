"""The backends: one module per output, each ``render_job(job, opts) -> str``.

``base.Job`` (spec, environment plan, command line) is what every backend takes, and each
has its own frozen options dataclass; quoting is left to ``launch.render``.

==============  ============================  ====================================
module          output                        options
==============  ============================  ====================================
``torchrun``    bash script: torchrun          ``TorchrunOptions`` (``--venv``)
``docker``      bash script: docker/podman     ``DockerOptions`` (``--cpu``)
``slurm``       sbatch script                  ``SlurmOptions``
``env``         ``export`` lines               none
``trainjob``    Trainer v2 TrainJob            ``k8s_options.K8sOptions``
``runtime``     Trainer v2 ClusterTrainingRuntime  ``k8s_options.K8sOptions``
``pytorchjob``  training-operator v1 PyTorchJob    ``k8s_options.K8sOptions``
==============  ============================  ====================================

``shell`` holds what the bash outputs share, ``k8s_pod`` the pod all manifests share.
Importing this package loads every backend (no Jinja, YAML or torch: templates load on use).
"""

from launch.backends import docker, env, pytorchjob, runtime, slurm, torchrun, trainjob

__all__ = ["docker", "env", "pytorchjob", "runtime", "slurm", "torchrun", "trainjob"]
