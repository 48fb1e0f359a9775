"""``train doctor``: check the GPU setup and estimate training memory before a job starts.

What it reports: torch / CUDA / cuDNN / NCCL / driver versions; each GPU's name,
compute capability, memory, FP8 and MXFP8 support (``train.hardware``); the CUDA
peer-access matrix and the NVLink/PCIe topology from ``nvidia-smi topo -m``; whether
torchao (and its C++ extensions) and Transformer Engine import; and a per-GPU memory
estimate for a model preset under DDP, FSDP2 and TP, with and without activation
checkpointing (``train.memory``), with the layout and micro-batch it recommends for
the GPUs it sees or for a hardware profile (``--profile``).

Exit status: 0 when nothing is wrong (a CPU-only machine included: it says so),
1 when a real problem was found (each one printed with its reason), 2 for usage errors.
Importing this module is cheap: torch is imported only when the command runs.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import click

from launch.safety import excerpt

GiB = 2**30
SCHEMA = "train-doctor/1"


# ----------------------------------------------------------------------------- profiles


def _profile_files() -> dict[str, Path]:
    """Hardware profiles by name: the ``launch`` package's search path when importable
    (honours ``LAUNCH_PROFILE_PATH``), else the YAML files shipped beside ``train``."""
    try:
        from launch.catalog import available
    except ImportError:
        directory = Path(__file__).resolve().parents[1] / "launch" / "profiles"
        return {p.stem: p for p in sorted(directory.glob("*.yaml"))}
    return available("profiles")


def load_profile(name: str) -> dict:
    """``{"name", "model", "arch", "gpus_per_node", "memory_gb", "fp8", "nvlink"}`` from a
    profile YAML; raises ``KeyError`` naming the valid profiles when ``name`` is unknown."""
    from launch.errors import InputError
    from launch.safety import load_yaml_file

    files = _profile_files()
    if name not in files:
        raise KeyError(f"--profile {excerpt(name)}: unknown profile (valid: {', '.join(files) or 'none found'})")
    try:
        data = load_yaml_file(files[name], "--profile") or {}
    except InputError as exc:
        raise KeyError(str(exc)) from None
    if not isinstance(data, dict):
        raise KeyError(f"--profile {excerpt(name)}: not a mapping")
    gpu = data.get("gpu") or {}
    from train.hardware import fp8_kinds, mxfp8_backends

    arch = str(gpu.get("arch") or "")
    cap = _capability(arch)
    return {
        "name": name,
        "model": gpu.get("model"),
        "arch": arch,
        "gpus_per_node": gpu.get("gpus_per_node"),
        "memory_gb": gpu.get("memory_gb"),
        "fp8": list(data.get("fp8") or []),
        "nvlink": bool((data.get("interconnect") or {}).get("nvlink")),
        "fp8_by_arch": list(fp8_kinds(cap)) if cap else None,
        "mxfp8_backends": list(mxfp8_backends(cap)) if cap else None,
    }


def _capability(arch: str) -> tuple[int, int] | None:
    """``sm_90`` -> (9, 0), ``sm_100`` -> (10, 0), ``sm_120`` -> (12, 0); None otherwise."""
    m = re.fullmatch(r"sm_(\d+)(\d)a?", arch.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


# ----------------------------------------------------------------------------- nvidia-smi


def _run(cmd: list[str], timeout: float = 20.0) -> str | None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def smi_gpus() -> list[dict] | None:
    """GPUs as nvidia-smi lists them (physical order), or None without nvidia-smi."""
    out = _run(["nvidia-smi", "--query-gpu=index,uuid,name,driver_version", "--format=csv,noheader"])
    if out is None:
        return None
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 4 and parts[0].isdigit():
            gpus.append({"index": int(parts[0]), "uuid": parts[1], "name": parts[2], "driver": parts[3]})
    return gpus


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_topology(text: str) -> dict[tuple[int, int], str]:
    """``nvidia-smi topo -m`` -> {(gpu_i, gpu_j): "NV18" | "PIX" | "SYS" | ...} over the
    physical GPU indices of its matrix (NIC rows and columns are ignored)."""
    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    columns: list[int] = []
    links: dict[tuple[int, int], str] = {}
    for line in lines:
        tokens = line.split()
        if not columns:
            gpu_cols = [t for t in tokens if re.fullmatch(r"GPU\d+", t)]
            if gpu_cols and not re.match(r"GPU\d+", line):  # the header row (starts with blanks)
                columns = [int(t[3:]) for t in gpu_cols]
            continue
        m = re.match(r"GPU(\d+)\s", line)
        if not m:
            if not line.strip() and links:
                break  # end of the matrix; the legend follows
            continue
        row = int(m.group(1))
        for col, cell in zip(columns, tokens[1:1 + len(columns)]):
            links[(row, col)] = cell
    return links


def _uuid_key(uuid: str) -> str:
    u = uuid.strip().lower()
    for prefix in ("gpu-", "mig-"):
        if u.startswith(prefix):
            u = u[len(prefix):]
    return u


def _physical_indices(torch_uuids: list[str | None], smi: list[dict] | None) -> list[int | None]:
    """nvidia-smi index of each torch device: by UUID, else by CUDA_VISIBLE_DEVICES,
    else identity when the counts agree."""
    n = len(torch_uuids)
    if smi:
        by_uuid = {_uuid_key(g["uuid"]): g["index"] for g in smi}
        mapped = [by_uuid.get(_uuid_key(u)) if u else None for u in torch_uuids]
        if all(m is not None for m in mapped):
            return mapped
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        if len(ids) >= n and all(v.isdigit() for v in ids[:n]):
            return [int(v) for v in ids[:n]]
        return [None] * n
    if smi is not None and len(smi) == n:
        return list(range(n))
    return [None] * n


# ----------------------------------------------------------------------------- libraries


def check_torchao() -> dict:
    """Import torchao; report its version and whether its C++ extensions loaded (torchao
    logs "Skipping import of cpp extensions ..." or "Failed to load ..." when they did not)."""
    import logging
    import warnings

    info: dict = {"installed": False, "version": None, "cpp_extensions": None, "detail": None}
    if "torchao" in sys.modules:
        import torchao

        info.update(installed=True, version=getattr(torchao, "__version__", None),
                    cpp_extensions="unknown", detail="imported before the check; its load messages were missed")
        return info

    records: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = logging.getLogger("torchao")
    handler, old_level = _Collect(logging.DEBUG), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torchao
    except ImportError as exc:
        if getattr(exc, "name", None) == "torchao":
            return info
        info.update(installed=True, detail=f"import failed: {exc}")
        return info
    except Exception as exc:  # a broken install raises anything
        info.update(installed=True, detail=f"import failed: {type(exc).__name__}: {exc}")
        return info
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    messages = records + [str(w.message) for w in caught]
    failed = [m for m in messages if "Skipping import of cpp extensions" in m or m.startswith("Failed to load")]
    shipped = list(Path(torchao.__file__).parent.glob("_C*.so"))
    if failed:
        status = "not loaded"
    elif shipped:
        status = "loaded"
    else:
        status = "none shipped"
    info.update(installed=True, version=getattr(torchao, "__version__", None), cpp_extensions=status,
                detail=" | ".join(" ".join(m.split()) for m in failed)[:500] or None)
    return info


def check_transformer_engine() -> dict:
    info: dict = {"installed": False, "version": None, "detail": None}
    try:
        import transformer_engine
    except ImportError as exc:
        if getattr(exc, "name", None) in ("transformer_engine", None):
            return info
        info.update(installed=True, detail=f"import failed: {exc}")
        return info
    except Exception as exc:
        info.update(installed=True, detail=f"import failed: {type(exc).__name__}: {exc}")
        return info
    info.update(installed=True, version=getattr(transformer_engine, "__version__", None))
    try:
        import transformer_engine.pytorch  # noqa: F401  (loads the C++/CUDA library)
    except Exception as exc:
        info["detail"] = f"transformer_engine.pytorch import failed: {type(exc).__name__}: {exc}"
    return info


# ----------------------------------------------------------------------------- NCCL


def nccl_selftest() -> str:
    """One-process NCCL group on GPU 0: init, all_reduce, destroy. Returns "ok" or raises."""
    import datetime

    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return "skipped: a process group already exists"
    device = torch.device("cuda", 0)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60), device_id=device)
    try:
        x = torch.full((1024,), 2.0, device=device)
        dist.all_reduce(x)
        torch.cuda.synchronize(device)
        if float(x[0]) != 2.0:
            raise RuntimeError(f"all_reduce over one rank returned {float(x[0])}, expected 2.0")
    finally:
        dist.destroy_process_group()
    return "ok"


# ----------------------------------------------------------------------------- collection


def collect_system(check_nccl: bool = False) -> dict:
    """Versions, GPUs, peer access, topology, FP8 support, libraries, NCCL; with the
    problems (exit 1) and warnings found."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import torch

        from train.hardware import fp8_kinds, mxfp8_backends, peak_bf16_tflops

        cuda_ok = torch.cuda.is_available()
        n = torch.cuda.device_count() if cuda_ok else 0
    problems: list[str] = []
    warns: list[str] = [" ".join(str(w.message).split()) for w in caught if "cuda" in str(w.message).lower()]
    notes: list[str] = []

    smi = smi_gpus()
    driver = smi[0]["driver"] if smi else None
    versions = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": None,
        "nccl": None,
        "driver": driver,
    }
    try:
        versions["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:  # a CPU build or broken cuDNN: reported as absent
        versions["cudnn"] = None

    from train.cuda_compat import fit, image_cuda, is_datacenter

    driver_fit = fit(driver, image_cuda(torch.version.cuda), is_datacenter(smi[0]["name"] if smi else None))
    if driver_fit.ok is False:
        problems.append(driver_fit.line)
    report: dict = {
        "driver_cuda": {"ok": driver_fit.ok, "line": driver_fit.line},
        "schema": SCHEMA,
        "host": platform.node(),
        "platform": f"{platform.system()} {platform.machine()}",
        "python": platform.python_version(),
        "versions": versions,
        "cuda_available": bool(cuda_ok),
        "gpus": [],
        "peer_access": None,
        "topology": {"source": None, "text": None, "links": None},
        "nccl": {"available": None, "version": None, "selftest": None},
    }

    smi_count = len(smi) if smi else 0
    if n == 0:
        if smi_count and torch.version.cuda is None:
            problems.append(f"torch {torch.__version__} is a CPU-only build but nvidia-smi lists {smi_count} GPU(s): "
                            "install a CUDA build of torch")
        elif smi_count:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            problems.append(f"nvidia-smi lists {smi_count} GPU(s) but torch sees none (driver {driver} too old for "
                            f"CUDA {torch.version.cuda}? CUDA_VISIBLE_DEVICES={visible!r}?)")
        else:
            notes.append("no CUDA GPU visible: CPU-only machine (train runs on the CPU with gloo)")
        report["libraries"] = {"torchao": check_torchao(), "transformer_engine": check_transformer_engine()}
        report.update(problems=problems, warnings=warns, notes=notes)
        return report

    uuids = []
    for i in range(n):
        p = torch.cuda.get_device_properties(i)
        cap = (p.major, p.minor)
        uuid = str(getattr(p, "uuid", "") or "") or None
        uuids.append(uuid)
        report["gpus"].append({
            "index": i,
            "name": p.name,
            "capability": f"{p.major}.{p.minor}",
            "sm": f"sm_{p.major}{p.minor}",
            "memory_bytes": int(p.total_memory),
            "memory_gib": round(p.total_memory / GiB, 1),
            "multiprocessors": p.multi_processor_count,
            "uuid": uuid,
            "fp8": list(fp8_kinds(cap)),
            "mxfp8": list(mxfp8_backends(cap)),
            "peak_bf16_tflops": peak_bf16_tflops(p.name),
        })
    names = {g["name"] for g in report["gpus"]}
    if len(names) > 1:
        warns.append(f"mixed GPU models: {', '.join(sorted(names))} (the slowest sets the pace of data parallelism)")
    if not report["gpus"][0]["fp8"]:
        notes.append(f"{report['gpus'][0]['name']} (sm_{report['gpus'][0]['sm'][3:]}) has no FP8 tensor cores: "
                     "fp8.backend must stay none")

    # peer access and topology
    peer = [[None if i == j else bool(torch.cuda.can_device_access_peer(i, j)) for j in range(n)] for i in range(n)]
    report["peer_access"] = peer
    topo_text = _run(["nvidia-smi", "topo", "-m"])
    links = None
    if topo_text:
        phys = _physical_indices(uuids, smi)
        table = parse_topology(topo_text)
        if all(x is not None for x in phys):
            links = [[table.get((phys[i], phys[j])) for j in range(n)] for i in range(n)]
        report["topology"] = {"source": "nvidia-smi topo -m", "text": _ANSI.sub("", topo_text), "links": links}
    elif n > 1:
        notes.append("nvidia-smi topo -m not available: NVLink/PCIe topology not checked")
    for i in range(n):
        for j in range(i + 1, n):
            link = links[i][j] if links else None
            if peer[i][j] and peer[j][i]:
                continue
            if link and link.startswith("NV"):
                problems.append(f"GPU {i} and GPU {j} are linked by NVLink ({link} in nvidia-smi topo -m) but CUDA "
                                "peer access between them is unavailable: NCCL would fall back to slower paths "
                                "(check the driver / fabric manager, and that no container blocks P2P)")
            else:
                warns.append(f"no CUDA peer access between GPU {i} and GPU {j}"
                             + (f" (link {link})" if link else "")
                             + ": NCCL goes through host memory, intra-node collectives are slower")

    # NCCL
    import torch.distributed as dist

    nccl = report["nccl"]
    nccl["available"] = bool(dist.is_available() and dist.is_nccl_available())
    try:
        ver = torch.cuda.nccl.version()
        versions["nccl"] = ".".join(str(x) for x in ver) if isinstance(ver, tuple) else str(ver)
        nccl["version"] = versions["nccl"]
    except Exception as exc:
        problems.append(f"NCCL unusable: torch.cuda.nccl.version() failed ({type(exc).__name__}: {exc})")
    if not nccl["available"]:
        problems.append("NCCL unusable: torch.distributed reports no NCCL backend in this torch build")
    elif check_nccl:
        try:
            nccl["selftest"] = nccl_selftest()
        except Exception as exc:
            nccl["selftest"] = f"failed: {type(exc).__name__}: {exc}"
            problems.append(f"NCCL unusable: one-process init + all_reduce on GPU 0 failed ({type(exc).__name__}: "
                            f"{' '.join(str(exc).split())[:300]})")

    report["libraries"] = {"torchao": check_torchao(), "transformer_engine": check_transformer_engine()}
    ao = report["libraries"]["torchao"]
    if ao["installed"] and ao["cpp_extensions"] == "not loaded":
        warns.append(f"torchao {ao['version']}: C++ extensions not loaded ({ao['detail']}); float8 training works "
                     "without them, MXFP8 casts and some kernels do not")
    report.update(problems=problems, warnings=warns, notes=notes)
    return report


# ----------------------------------------------------------------------------- memory


def memory_section(preset: str, seq: int, batch: int, gpus: int, gpu_bytes: int | None, source: str,
                   torch_version: str) -> dict:
    from train.memory import (
        USABLE_FRACTION,
        norm_fp32_in_autocast,
        param_count,
        recommend,
    )
    from train.models.presets import MODEL_PRESETS

    cfg = MODEL_PRESETS[preset]
    rec = recommend(cfg, seq, batch, gpus, gpu_bytes, norm_fp32=norm_fp32_in_autocast(torch_version))
    return {
        "preset": preset,
        "params": param_count(cfg),
        "seq": seq,
        "batch": batch,
        "gpus": gpus,
        "gpu_memory_gib": round(gpu_bytes / GiB, 1) if gpu_bytes else None,
        "usable_fraction": USABLE_FRACTION,
        "source": source,
        "precision": "bf16 autocast, fp32 master weights and gradients, AdamW fp32 m/v",
        "torch": torch_version,  # rms_norm's autocast policy depends on it (train.memory)
        "estimates": rec.rows,
        "recommendation": rec.to_dict(),
    }


def measure_step_peak(preset: str, seq: int, batch: int, ac: str = "none", steps: int = 3,
                      device_index: int = 0) -> dict:
    """Run ``steps`` real training steps of the preset on one GPU through ``train.trainer``
    (synthetic data, bf16, ``parallel.ac=ac``) and compare ``torch.cuda.max_memory_allocated``
    (less what was allocated before) with the estimate."""
    import gc
    import tempfile

    import torch

    from train.config import load_config
    from train.distributed import DistInfo
    from train.memory import Plan, estimate, norm_fp32_in_autocast
    from train.trainer import Trainer

    device = torch.device("cuda", device_index)
    torch.cuda.set_device(device)
    job = load_config(None, [
        f"model.name={preset}", f"train.seq_len={seq}", f"train.batch_size={batch}", f"train.steps={steps}",
        "data.source=synthetic", "train.precision=bf16", f"parallel.ac={ac}", "metrics.progress=false",
    ])
    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(job, DistInfo(0, 0, 1, device, None), Path(tmp))
        wrapped = sum("checkpoint" in type(m).__name__.lower() for m in trainer.par.inner.modules())
        if (ac == "none") != (wrapped == 0):
            raise RuntimeError(f"parallel.ac={ac} but the trainer wrapped {wrapped} block(s) for checkpointing")
        for _ in range(steps):
            trainer.train_step()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
        del trainer
    gc.collect()
    torch.cuda.empty_cache()
    plan = Plan("single", 1, ac=ac, norm_fp32=norm_fp32_in_autocast(torch.__version__))
    est = estimate(job.model, batch, seq, plan)
    return {
        "preset": preset, "seq": seq, "batch": batch, "ac": ac, "steps": steps,
        "measured_bytes": int(peak), "estimate_bytes": est.peak, "estimate_phase": est.peak_phase,
        "error": (est.peak - peak) / peak if peak else None,
        "device": torch.cuda.get_device_name(device),
    }


# ----------------------------------------------------------------------------- rendering


def _gib(x: int | None) -> str:
    return "-" if x is None else f"{x / GiB:.2f}"


def _table(headers: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    fmt = lambda r: indent + "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return [fmt(headers), indent + "  ".join("-" * w for w in widths), *[fmt(r) for r in rows]]


def render_text(report: dict) -> str:
    v = report["versions"]
    out = ["train doctor: GPU setup check", ""]
    out.append(f"host      {report['host']} ({report['platform']}), Python {report['python']}")
    out.append(f"torch     {v['torch']}   CUDA {v['cuda'] or 'none'}   cuDNN {v['cudnn'] or 'none'}   "
               f"NCCL {v['nccl'] or 'none'}   driver {v['driver'] or 'none'}")
    if "driver_cuda" in report:
        out.append(report["driver_cuda"]["line"])
    out.append("")
    gpus = report["gpus"]
    if not gpus:
        out.append("GPUs      none visible")
    else:
        rows = [[g["index"], g["name"], g["sm"], f"{g['memory_gib']:.1f}", g["multiprocessors"],
                 ", ".join(g["fp8"]) or "no", ", ".join(g["mxfp8"]) or "no",
                 g["peak_bf16_tflops"] or "?"] for g in gpus]
        out.append("GPUs")
        out += _table(["#", "name", "arch", "GiB", "SMs", "FP8", "MXFP8 backends", "bf16 TFLOPS"], rows)
        if len(gpus) > 1:
            out.append("")
            out.append("Peer access (P2P) / link from nvidia-smi topo -m")
            links = report["topology"]["links"]
            head = [""] + [f"GPU{j}" for j in range(len(gpus))]
            rows = []
            for i, row in enumerate(report["peer_access"]):
                cells = []
                for j, ok in enumerate(row):
                    if ok is None:
                        cells.append("X")
                    else:
                        link = links[i][j] if links else None
                        cells.append(("yes" if ok else "NO") + (f"/{link}" if link else ""))
                rows.append([f"GPU{i}", *cells])
            out += _table(head, rows)
    out.append("")
    out.append("Libraries")
    ao, te = report["libraries"]["torchao"], report["libraries"]["transformer_engine"]
    ao_line = "not installed" if not ao["installed"] else (
        f"{ao['version']}  C++ extensions: {ao['cpp_extensions']}" + (f" ({ao['detail']})" if ao["detail"] else ""))
    te_line = "not installed" if not te["installed"] else (
        f"{te['version']}" + (f"  ({te['detail']})" if te["detail"] else ""))
    out.append(f"  torchao             {ao_line}")
    out.append(f"  transformer_engine  {te_line}")
    nccl = report["nccl"]
    if nccl.get("selftest"):
        out.append(f"  NCCL self-test      {nccl['selftest']}")

    prof = report.get("profile")
    if prof:
        out.append("")
        fp8 = ", ".join(prof["fp8_by_arch"] or []) or "no"
        mx = ", ".join(prof["mxfp8_backends"] or []) or "none"
        out.append(f"Profile   {prof['name']}: {prof['model']}, {prof['arch']}, {prof['gpus_per_node']} GPUs/node, "
                   f"{prof['memory_gb'] or '?'} GB, NVLink {'yes' if prof['nvlink'] else 'no'}")
        out.append(f"          FP8 ({prof['arch']}): {fp8}; MXFP8 backends: {mx}; profile lists: "
                   f"{', '.join(prof['fp8']) or 'none'}")
    mem = report.get("memory")
    if mem:
        out.append("")
        out.append(f"Memory per GPU: preset {mem['preset']} ({mem['params'] / 1e9:.2f} B params), seq {mem['seq']}, "
                   f"batch {mem['batch']} per GPU, {mem['gpus']} GPU(s) [{mem['source']}]")
        out.append(f"  {mem['precision']}; GiB; peak = max over forward, backward, AC recompute, optimizer step")
        rows = []
        for r in mem["estimates"]:
            rows.append([r["label"], _gib(r["params"]), _gib(r["grads"]), _gib(r["optimizer"]),
                         _gib(r["weights_backward"]), _gib(r["activations"]), _gib(r["loss_buffers"]),
                         _gib(r["peak"]), r.get("max_batch", "-") if mem["gpu_memory_gib"] else "-"])
        out += _table(["layout", "params", "grads", "optim", "bf16 w", "activ.", "loss", "peak", "max batch"], rows)
        rec = mem["recommendation"]
        budget = (f"{mem['usable_fraction'] * 100:.0f}% of {mem['gpu_memory_gib']} GiB"
                  if mem["gpu_memory_gib"] else "unknown GPU memory")
        if rec["strategy"]:
            out.append(f"  recommended: {rec['label']}, batch {rec['batch_per_gpu']} per GPU "
                       f"(max {rec['max_batch_per_gpu']} within {budget}); {rec['reason']}")
        else:
            out.append(f"  recommended: none ({rec['reason']})")
        for m in mem.get("measured", []):
            if "error" in m and isinstance(m["error"], float):
                out.append(f"  measured (ac={m['ac']}, {m['steps']} steps on {m['device']}): "
                           f"{_gib(m['measured_bytes'])} GiB vs estimate {_gib(m['estimate_bytes'])} GiB "
                           f"({m['error'] * 100:+.1f}%)")
            else:
                out.append(f"  measured (ac={m.get('ac')}): {m.get('skipped') or m.get('failed')}")
    out.append("")
    for label, key in (("note", "notes"), ("warning", "warnings"), ("PROBLEM", "problems")):
        for msg in report.get(key, []):
            out.append(f"{label}: {msg}")
    out.append(f"result: {'OK' if report['ok'] else 'PROBLEMS FOUND'} (exit {report['exit_code']})")
    return "\n".join(out)


# ----------------------------------------------------------------------------- command


def _defaults(preset: str) -> tuple[int, int]:
    """(seq, batch) from ``train/configs/<preset>.yaml`` when it exists, else (2048, 1)."""
    import yaml

    path = Path(__file__).parent / "configs" / f"{preset}.yaml"
    train = {}
    if path.is_file():
        train = (yaml.safe_load(path.read_text()) or {}).get("train") or {}
    return int(train.get("seq_len", 2048)), int(train.get("batch_size", 1))


@click.command("doctor")
@click.option("--preset", default="1b", show_default=True, help="Model preset for the memory estimate.")
@click.option("--seq", type=int, help="Sequence length (default: the preset's config, else 2048).")
@click.option("--batch", type=int, help="Micro-batch per GPU (default: the preset's config, else 1).")
@click.option("--gpus", type=int, help="GPU count for the estimate (default: visible GPUs, or the profile's).")
@click.option("--profile", help="Estimate for a hardware profile (h100, h200, b200, gb200, rtx-pro-6000...).")
@click.option("--check-nccl", is_flag=True, help="Also start a one-process NCCL group on GPU 0 and all_reduce.")
@click.option("--measure", is_flag=True, help="Run 3 real steps on GPU 0 (without and with AC) and compare "
                                              "the measured peak memory with the estimate.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def doctor(preset, seq, batch, gpus, profile, check_nccl, measure, as_json) -> None:
    """Check GPUs, drivers, NCCL, FP8 support and libraries; estimate memory per GPU."""
    from train.console import fail
    from train.models.presets import MODEL_PRESETS

    if preset not in MODEL_PRESETS:
        fail(f"--preset {excerpt(preset)}: unknown preset (valid: {', '.join(MODEL_PRESETS)})", 2)
    for option, value, top in (("--seq", seq, 1 << 24), ("--batch", batch, 1 << 20), ("--gpus", gpus, 1 << 20)):
        if value is not None and not 1 <= value <= top:  # 0 must not silently mean "the default"
            fail(f"{option} {value}: must be in 1..{top}", 2)
    d_seq, d_batch = _defaults(preset)
    seq = seq if seq is not None else min(d_seq, MODEL_PRESETS[preset].max_seq_len)
    batch = batch if batch is not None else d_batch
    if seq > MODEL_PRESETS[preset].max_seq_len:
        fail(f"--seq {seq}: longer than model.max_seq_len={MODEL_PRESETS[preset].max_seq_len} of preset {preset}", 2)
    prof = None
    if profile:
        try:
            prof = load_profile(profile)
        except KeyError as exc:
            fail(exc.args[0], 2)

    report = collect_system(check_nccl=check_nccl)
    if prof:
        count = gpus or prof["gpus_per_node"] or 1
        mem_bytes = int(prof["memory_gb"] * GiB) if prof["memory_gb"] else None
        source = f"profile {prof['name']}: {prof['model']}"
        if not mem_bytes:
            report["notes"].append(f"profile {prof['name']} has no gpu.memory_gb: no recommendation")
        report["profile"] = prof
    elif report["gpus"]:
        count = gpus or len(report["gpus"])
        mem_bytes = min(g["memory_bytes"] for g in report["gpus"])
        source = f"visible GPUs: {report['gpus'][0]['name']}"
    else:
        count = gpus or 8
        mem_bytes = None
        source = "no GPU visible; use --profile for a recommendation"
    report["memory"] = memory_section(preset, seq, batch, count, mem_bytes, source, report["versions"]["torch"])
    if measure:
        report["memory"]["measured"] = _measure_all(report, preset, seq, batch)
    report["exit_code"] = 1 if report["problems"] else 0
    report["ok"] = not report["problems"]
    if as_json:
        click.echo(json.dumps(report, indent=2, default=str))
    else:
        click.echo(render_text(report))
    sys.exit(report["exit_code"])


def _measure_all(report: dict, preset: str, seq: int, batch: int) -> list[dict]:
    if not report["gpus"]:
        report["notes"].append("--measure needs a CUDA GPU: skipped")
        return [{"ac": ac, "skipped": "no CUDA GPU"} for ac in ("none", "full")]
    results = []
    for ac in ("none", "full"):
        try:
            results.append(measure_step_peak(preset, seq, batch, ac))
        except Exception as exc:  # an OOM or a trainer error is reported, not fatal
            results.append({"ac": ac, "failed": f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"})
    return results
