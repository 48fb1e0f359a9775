"""The backends: one module per output, each ``render_job(job, opts) -> str``.

``base.Job`` (spec, environment plan, command line) is what every backend takes; ``opts``
is the backend's own frozen dataclass of options. Quoting is left to ``launch.render``.

* ``torchrun``   - bash script running torchrun; ``TorchrunOptions`` (``--venv``)
* ``docker``     - bash script running torchrun in docker/podman; ``DockerOptions`` (``--cpu``)
* ``slurm``      - sbatch script; ``SlurmOptions``
* ``env``        - ``export`` lines; no options (``render_job(job)``)
* ``trainjob``   - Kubeflow Trainer v2 TrainJob; ``k8s_options.K8sOptions``
* ``runtime``    - Kubeflow Trainer v2 ClusterTrainingRuntime; ``k8s_options.K8sOptions``
* ``pytorchjob`` - training-operator v1 PyTorchJob; ``k8s_options.K8sOptions``

``shell`` holds what the bash outputs share, ``k8s_pod`` the pod every manifest shares.
Importing this package loads every backend (cheap: Jinja and YAML load on first render).
"""

from launch.backends import docker, env, pytorchjob, runtime, slurm, torchrun, trainjob

__all__ = ["docker", "env", "pytorchjob", "runtime", "slurm", "torchrun", "trainjob"]
