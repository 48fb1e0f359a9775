"""The system half of ``train doctor``'s report: versions, GPUs, peer access, topology,
FP8 support, libraries and NCCL, with the problems (exit 1), warnings and notes found.

GPU facts (FP8 kinds, MXFP8 backends, peak BF16 rate) come from ``train.hardware``; the
driver/CUDA verdict from ``train.doctor.cuda_compat``. torch is imported when
:func:`collect_system` runs, not with this module.
"""

from __future__ import annotations

import os
import platform
import warnings
from dataclasses import dataclass, field

from train.doctor import libraries, probes
from train.doctor.cuda_compat import cpu_arch, fit, image_cuda, is_datacenter
from train.doctor.netplugin import probe as probe_net_plugin
from train.hardware import fp8_kinds, mxfp8_backends, peak_bf16_tflops
from train.memory import GiB

SCHEMA = "train-doctor/1"


@dataclass
class _Findings:
    problems: list[str] = field(default_factory=list)  # exit 1
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def collect_system(check_nccl: bool = False) -> dict:
    """Versions, GPUs, peer access, topology, FP8 support, libraries, NCCL; with the
    problems (exit 1) and warnings found."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import torch

        cuda_ok = torch.cuda.is_available()
        n = torch.cuda.device_count() if cuda_ok else 0
    found = _Findings(warnings=[" ".join(str(w.message).split()) for w in caught
                                if "cuda" in str(w.message).lower()])
    smi = probes.smi_gpus()
    report = _base_report(torch, smi, bool(cuda_ok), found)
    if n == 0:
        _no_gpu(torch, smi, found)
        report["libraries"] = _libraries()
    else:
        report["gpus"] = _gpu_rows(torch, n)
        _check_gpus(report["gpus"], found)
        _check_links(report, torch, smi, found)
        _check_nccl(report, torch, check_nccl, found)
        report["libraries"] = _libraries()
        _check_torchao(report["libraries"]["torchao"], found)
    report.update(problems=found.problems, warnings=found.warnings, notes=found.notes)
    return report


def _versions(torch, driver: str | None) -> dict:
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": None, "nccl": None,
                "driver": driver}
    try:
        versions["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:  # a CPU build or broken cuDNN: reported as absent
        versions["cudnn"] = None
    return versions


def _base_report(torch, smi: list[dict] | None, cuda_ok: bool, found: _Findings) -> dict:
    """What every report has: host, versions, the driver/CUDA verdict; GPU fields empty."""
    driver = smi[0]["driver"] if smi else None
    driver_fit = fit(driver, image_cuda(torch.version.cuda), is_datacenter(smi[0]["name"] if smi else None),
                     platform.machine())
    if driver_fit.ok is False:
        found.problems.append(driver_fit.line)
    net = probe_net_plugin()  # which NCCL net plugin NCCL would dlopen (a child process, no NCCL init)
    if net.env and net.env != "none" and not net.usable:
        found.problems.append(net.line)  # a plugin was asked for (e.g. the efa fabric) and does not load
    return {
        "driver_cuda": {"ok": driver_fit.ok, "line": driver_fit.line},
        "net_plugin": net.as_dict(),
        "schema": SCHEMA,
        "host": platform.node(),
        "platform": f"{platform.system()} {platform.machine()}",
        "cpu_arch": cpu_arch(platform.machine()),
        "python": platform.python_version(),
        "versions": _versions(torch, driver),
        "cuda_available": cuda_ok,
        "gpus": [],
        "peer_access": None,
        "topology": {"source": None, "text": None, "links": None},
        "nccl": {"available": None, "version": None, "selftest": None},
    }


def _no_gpu(torch, smi: list[dict] | None, found: _Findings) -> None:
    """torch sees no GPU: a CPU-only machine (a note), or GPUs torch cannot use (a problem)."""
    smi_count = len(smi) if smi else 0
    if smi_count and torch.version.cuda is None:
        found.problems.append(f"torch {torch.__version__} is a CPU-only build but nvidia-smi lists {smi_count} "
                              "GPU(s): install a CUDA build of torch")
    elif smi_count:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        driver = smi[0]["driver"]
        found.problems.append(f"nvidia-smi lists {smi_count} GPU(s) but torch sees none (driver {driver} too old "
                              f"for CUDA {torch.version.cuda}? CUDA_VISIBLE_DEVICES={visible!r}?)")
    else:
        found.notes.append("no CUDA GPU visible: CPU-only machine (train runs on the CPU with gloo)")


def _gpu_rows(torch, n: int) -> list[dict]:
    rows = []
    for i in range(n):
        p = torch.cuda.get_device_properties(i)
        cap = (p.major, p.minor)
        rows.append({
            "index": i,
            "name": p.name,
            "capability": f"{p.major}.{p.minor}",
            "sm": f"sm_{p.major}{p.minor}",
            "memory_bytes": int(p.total_memory),
            "memory_gib": round(p.total_memory / GiB, 1),
            "multiprocessors": p.multi_processor_count,
            "uuid": str(getattr(p, "uuid", "") or "") or None,
            "fp8": list(fp8_kinds(cap)),
            "mxfp8": list(mxfp8_backends(cap)),
            "peak_bf16_tflops": peak_bf16_tflops(p.name),
        })
    return rows


def _check_gpus(gpus: list[dict], found: _Findings) -> None:
    names = {g["name"] for g in gpus}
    if len(names) > 1:
        found.warnings.append(f"mixed GPU models: {', '.join(sorted(names))} (the slowest sets the pace of data "
                              "parallelism)")
    if not gpus[0]["fp8"]:
        found.notes.append(f"{gpus[0]['name']} (sm_{gpus[0]['sm'][3:]}) has no FP8 tensor cores: "
                           "fp8.backend must stay none")


def _check_links(report: dict, torch, smi: list[dict] | None, found: _Findings) -> None:
    """CUDA peer access between every pair, and the link nvidia-smi reports between them."""
    n = len(report["gpus"])
    peer = [[None if i == j else bool(torch.cuda.can_device_access_peer(i, j)) for j in range(n)] for i in range(n)]
    report["peer_access"] = peer
    topo = probes.topology([g["uuid"] for g in report["gpus"]], smi)
    links = None
    if topo:
        report["topology"] = topo
        links = topo["links"]
    elif n > 1:
        found.notes.append("nvidia-smi topo -m not available: NVLink/PCIe topology not checked")
    for i in range(n):
        for j in range(i + 1, n):
            link = links[i][j] if links else None
            if peer[i][j] and peer[j][i]:
                continue
            if link and link.startswith("NV"):
                found.problems.append(
                    f"GPU {i} and GPU {j} are linked by NVLink ({link} in nvidia-smi topo -m) but CUDA peer access "
                    "between them is unavailable: NCCL would fall back to slower paths (check the driver / fabric "
                    "manager, and that no container blocks P2P)")
            else:
                found.warnings.append(f"no CUDA peer access between GPU {i} and GPU {j}"
                                      + (f" (link {link})" if link else "")
                                      + ": NCCL goes through host memory, intra-node collectives are slower")


def _check_nccl(report: dict, torch, check_nccl: bool, found: _Findings) -> None:
    import torch.distributed as dist

    nccl, versions = report["nccl"], report["versions"]
    nccl["available"] = bool(dist.is_available() and dist.is_nccl_available())
    try:
        ver = torch.cuda.nccl.version()
        versions["nccl"] = ".".join(str(x) for x in ver) if isinstance(ver, tuple) else str(ver)
        nccl["version"] = versions["nccl"]
    except Exception as exc:
        found.problems.append(f"NCCL unusable: torch.cuda.nccl.version() failed ({type(exc).__name__}: {exc})")
    if not nccl["available"]:
        found.problems.append("NCCL unusable: torch.distributed reports no NCCL backend in this torch build")
    elif check_nccl:
        try:
            nccl["selftest"] = probes.nccl_selftest()
        except Exception as exc:
            nccl["selftest"] = f"failed: {type(exc).__name__}: {exc}"
            found.problems.append(f"NCCL unusable: one-process init + all_reduce on GPU 0 failed "
                                  f"({type(exc).__name__}: {' '.join(str(exc).split())[:300]})")


def _libraries() -> dict:
    return {"torchao": libraries.check_torchao(), "transformer_engine": libraries.check_transformer_engine()}


def _check_torchao(ao: dict, found: _Findings) -> None:
    if ao["installed"] and ao["cpp_extensions"] == "not loaded":
        found.warnings.append(f"torchao {ao['version']}: C++ extensions not loaded ({ao['detail']}); float8 "
                              "training works without them, MXFP8 casts and some kernels do not")
