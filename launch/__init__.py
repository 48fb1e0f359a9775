"""Launchers for distributed PyTorch training on Hopper and Blackwell GPUs.

Describe a job once; ``launch`` renders a torchrun script, a docker wrapper, an
sbatch script, a Kubeflow PyTorchJob or the bare environment from the same
typed spec, with hardware profiles and fabrics kept as YAML data.

This package never imports torch (it runs on laptops and login nodes).
"""

__all__ = ["__version__"]
__version__ = "0.1.0"
