"""Probes of the machine for ``train doctor``: nvidia-smi (GPUs, NVLink/PCIe topology) and
a one-process NCCL self-test. No torch import at module level."""

from __future__ import annotations

import os
import re
import subprocess


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


def nccl_selftest() -> str:
    """One-process NCCL group on GPU 0: init, all_reduce, destroy. Returns "ok" or raises."""
    import datetime

    import torch
    import torch.distributed as dist

    from train import distributed as tdist

    if dist.is_initialized():
        return "skipped: a process group already exists"
    device = torch.device("cuda", 0)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60), device_id=device)
    with tdist.group_teardown():  # the one teardown of every command (train/distributed.py)
        x = torch.full((1024,), 2.0, device=device)
        dist.all_reduce(x)
        torch.cuda.synchronize(device)
        if float(x[0]) != 2.0:
            raise RuntimeError(f"all_reduce over one rank returned {float(x[0])}, expected 2.0")
    return "ok"


def topology(torch_uuids: list[str | None], smi: list[dict] | None) -> dict | None:
    """``nvidia-smi topo -m`` for the torch devices: ``{"source", "text", "links"}`` with
    ``links[i][j]`` the link between torch devices i and j (None when the devices cannot be
    matched to nvidia-smi's indices); None when nvidia-smi gives no topology."""
    text = _run(["nvidia-smi", "topo", "-m"])
    if not text:
        return None
    n = len(torch_uuids)
    phys = _physical_indices(torch_uuids, smi)
    table = parse_topology(text)
    links = None
    if all(x is not None for x in phys):
        links = [[table.get((phys[i], phys[j])) for j in range(n)] for i in range(n)]
    return {"source": "nvidia-smi topo -m", "text": _ANSI.sub("", text), "links": links}
