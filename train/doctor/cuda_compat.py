"""Does this NVIDIA driver run this CUDA? One line for `train doctor`.

The rules are data (train/doctor/cuda_driver.yaml, each with its NVIDIA source); this module
only compares versions. No torch import: the inputs are strings, so the verdict is tested
on a CPU machine with simulated driver/CUDA versions.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from core.safety import load_yaml_file

DATA = Path(__file__).resolve().parent / "cuda_driver.yaml"


@dataclass(frozen=True)
class Fit:
    ok: bool | None  # None: cannot tell (no driver / no CUDA)
    line: str


def _version(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    m = re.match(r"\s*(\d+(?:\.\d+)*)", str(text))
    return tuple(int(p) for p in m.group(1).split(".")) if m else None


@lru_cache(maxsize=1)
def rules() -> dict:
    data = load_yaml_file(DATA, "rules")
    return {
        "floor": {int(k): _version(v) for k, v in data["minor_version_floor"].items()},
        "forward": [(int(e["branch"]), _version(e["min"])) for e in data["forward_compatible"]],
    }


def image_cuda(torch_cuda: str | None) -> str | None:
    """The image's CUDA: NGC images set CUDA_VERSION (e.g. 12.8.1.012); else torch's build."""
    return os.environ.get("CUDA_VERSION") or torch_cuda


_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def cpu_arch(machine: str | None) -> str | None:
    """The image architecture (``amd64`` / ``arm64``, as profiles and ``--platform`` name it) of
    ``platform.machine()`` (``x86_64``, ``aarch64``; ``AMD64``, ``arm64`` elsewhere); None if unknown."""
    return _ARCH.get((machine or "").lower())


def fit(driver: str | None, cuda: str | None, datacenter: bool | None = None, machine: str | None = None) -> Fit:
    """``driver`` as nvidia-smi prints it (570.124.06), ``cuda`` the image's CUDA (12.8.1), ``machine``
    the CPU (``platform.machine()``): named at the end of the line, e.g. ``(CPU aarch64 = arm64)``."""
    verdict = _fit(driver, cuda, datacenter)
    if not machine:
        return verdict
    arch = cpu_arch(machine)
    where = f"CPU {machine}" + (f" = {arch}" if arch and arch != machine else "")
    return Fit(verdict.ok, f"{verdict.line} ({where})")


def _fit(driver: str | None, cuda: str | None, datacenter: bool | None) -> Fit:
    d, c = _version(driver), _version(cuda)
    if c is None:
        return Fit(None, "driver/CUDA: CPU-only torch, no CUDA to check")
    if d is None:
        return Fit(None, f"driver/CUDA: image CUDA {cuda}, no NVIDIA driver found (nvidia-smi)")
    r = rules()
    floor = r["floor"].get(c[0])
    if floor is None:
        return Fit(None, f"driver/CUDA: no rule for CUDA {c[0]}.x in {DATA.name}; driver {driver}")
    floor_text = ".".join(map(str, floor))
    if d >= floor:
        return Fit(True, f"driver/CUDA: fit - driver {driver} runs CUDA {cuda} "
                         f"(CUDA {c[0]}.x needs >= {floor_text})")
    forward = [m for branch, m in r["forward"] if d[0] == branch and d >= m]
    if forward:
        if datacenter is False:
            return Fit(False, f"driver/CUDA: NO - driver {driver} < {floor_text} for CUDA {cuda}; forward "
                              "compatibility (cuda-compat) is for data center GPUs only: upgrade the driver")
        where = "" if datacenter else " if this is a data center GPU"
        return Fit(True, f"driver/CUDA: fit through forward compatibility{where} - driver {driver} < {floor_text} "
                         f"runs CUDA {cuda} only with the cuda-compat package (NGC images carry it)")
    return Fit(False, f"driver/CUDA: NO - driver {driver} is older than {floor_text}, which CUDA {cuda} needs "
                      f"(\"CUDA driver version is insufficient\"): upgrade the driver, or use an image on an "
                      f"older CUDA (docker/README.md: targets and driver floors)")


_DATACENTER = re.compile(r"\b(H100|H200|H20|H800|B100|B200|B300|GB200|GB300|GH200|A100|A30|A10|A40|L40S?|L4|T4|V100)\b")


def is_datacenter(gpu_name: str | None) -> bool | None:
    """A rough guess from the GPU name (forward compatibility needs a data center GPU)."""
    if not gpu_name or "Server Edition" in gpu_name:  # NGC Server Ready RTX SKUs: some are supported
        return None
    return bool(_DATACENTER.search(gpu_name))
