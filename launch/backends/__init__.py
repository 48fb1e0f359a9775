"""The backends: one module per output, each ``render_job(job, opts) -> str``, each describing
itself in ``registry.BACKENDS`` (``registry.Backend``: name, options, owned environment names,
render function), from which ``launch/cli.py`` builds its subcommands.

``base.Job`` (spec, environment plan, command line) is what every backend takes; ``opts``
is the backend's own frozen dataclass of options. Quoting is left to ``launch.render``.
``shell`` holds what the bash outputs share, ``k8s_pod`` the pod every manifest shares,
``k8s_options`` the Kubernetes options.

Importing this package imports every module in it, so a new backend module registers
itself (cheap: Jinja and YAML load on first render).
"""

import importlib
import pkgutil

from launch.backends.registry import BACKENDS

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["BACKENDS"]
