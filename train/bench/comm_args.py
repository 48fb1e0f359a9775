"""The arguments of ``train bench comm``: message sizes, and every option checked before any
process group exists (``ValueError``: a usage error, exit 2)."""

from __future__ import annotations

import os
import re

from core.safety import excerpt, excerpt_path
from train.bench.bandwidth import bus_factor

DTYPES = ("float32", "bfloat16", "float16", "int8")  # torch dtype names (torch_dtype)
MAX_BYTES = 64 << 30  # per message: beyond any GPU's free memory for a buffer pair
MAX_SECONDS = 3600.0  # --max-seconds per size: an hour at most (and a finite number)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """``"8"``, ``"64K"``, ``"1M"``, ``"4G"``, ``"1GiB"``, ``"512MB"`` -> bytes (binary units, as nccl-tests)."""
    m = re.fullmatch(r"\s*([0-9]{1,12}(?:\.[0-9]{1,6})?)\s*([KMGT]?)(?:i?B)?\s*", str(text),
                     flags=re.IGNORECASE | re.ASCII)
    if not m:
        raise ValueError(f"not a size: {text!r} (examples: 8, 64K, 1M, 4G)")
    size = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if size > MAX_BYTES:
        raise ValueError(f"size {text!r} is more than {MAX_BYTES >> 30} GiB")
    return size


def size_range(lo: int, hi: int, factor: int) -> list[int]:
    if lo < 1 or hi < lo:
        raise ValueError(f"need 1 <= min-bytes <= max-bytes, got {lo}..{hi}")
    if factor < 2:
        raise ValueError(f"--factor must be >= 2, got {factor}")
    sizes, s = [], lo
    while s <= hi:
        sizes.append(s)
        s *= factor
    return sizes


def human(nbytes: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def check_args(backend, ops, dtypes, min_bytes, max_bytes, factor, warmup, iters, max_seconds, p2p_bytes, impl,
                out_dir, name, recommend, apply_path, tflops, tokens_per_gpu, graph=False) -> dict:
    """Every argument checked before any process group exists (ValueError: usage error)."""
    from train.bench.latency import parse_impls
    from train.bench.report import (
        NAME_MAX,
        REPORT_SUFFIXES,
        check_report,
        choice_list,
        comma_list,
    )
    from train.preflight import check_launcher_env

    impls = parse_impls(impl) if impl is not None else []
    check_report(out_dir, name)
    reports = [name]  # every report this run writes, checked before the sweep
    if p2p_bytes is not None and not impls:
        reports.append(f"{name}_p2p")
        if len(reports[1]) > NAME_MAX:
            raise ValueError(f"--name {excerpt(name)}: at most {NAME_MAX - len('_p2p')} characters here "
                             "(the P2P report is NAME_p2p)")
        check_report(out_dir, reports[1])
    op_list = comma_list(ops, "--ops")
    for o in op_list:
        bus_factor(o, 2)
    dtype_list = choice_list(dtypes, "--dtype", DTYPES)
    lo, hi = ("4K", "4M") if impls else ("8", "1G")
    sizes = size_range(parse_size(lo if min_bytes is None else min_bytes),
                       parse_size(hi if max_bytes is None else max_bytes), factor)
    if warmup < 1 or iters < 1 or not 0 < max_seconds <= MAX_SECONDS:
        raise ValueError(f"--warmup and --iters must be >= 1, --max-seconds in (0, {MAX_SECONDS}]")
    recommend = recommend or apply_path is not None
    if recommend and ("all_reduce" not in op_list or impls):
        raise ValueError("--recommend needs all_reduce in --ops (and no --impl)")
    if (tflops is not None and tflops <= 0) or (tokens_per_gpu is not None and tokens_per_gpu <= 0):
        raise ValueError("--tflops and --tokens-per-gpu must be > 0")
    if apply_path is not None:  # a config the bench could not write is refused before the bench
        from train.bench.advice import read_apply_target

        for report in reports:
            if os.path.realpath(apply_path) in {os.path.realpath(out_dir / f"{report}{x}") for x in REPORT_SUFFIXES}:
                raise ValueError(f"--apply {excerpt_path(apply_path)}: that is this run's own report")
        read_apply_target(apply_path)
    world = check_launcher_env()  # RANK etc. (ConfigError: one line, exit 2)
    if world < 2:
        raise ValueError("train bench comm needs >= 2 processes: run it under torchrun --nproc-per-node N (N >= 2)")
    import torch

    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("--backend nccl: needs CUDA GPUs (none visible here); use --backend gloo")
    p2p = parse_size(p2p_bytes) if p2p_bytes is not None else 0
    _check_fits(max(sizes), p2p, world, backend)
    if "symm_mem" in impls and backend != "nccl":  # nccl implies CUDA GPUs (checked above)
        raise ValueError("--impl symm_mem: needs CUDA GPUs and the nccl backend (symmetric memory is GPU memory)")
    if graph and backend != "nccl":
        raise ValueError("--graph: CUDA graphs need CUDA GPUs and the nccl backend (on CPU only host_us is measured)")
    return {"ops": op_list, "dtypes": dtype_list, "sizes": sizes, "p2p_bytes": p2p,
            "impls": impls, "backend": backend, "recommend": recommend}


def torch_dtype(name: str):
    """The torch dtype named ``name`` (one of DTYPES)."""
    import torch

    return getattr(torch, name)


def _check_fits(largest: int, p2p: int, world: int, backend: str) -> None:
    """The largest message's buffers (a message is the larger side of a collective, as in
    nccl-tests: its input and output at most) and the P2P buffer fit the memory each process
    has: a GPU's, or its share of the host's memory with gloo."""
    from train.hardware import host_memory_bytes
    from train.preflight import local_gpu

    need = max(2 * largest, p2p)
    if backend == "nccl":  # this rank's GPU
        import torch

        index = local_gpu()
        have, where = torch.cuda.get_device_properties(index).total_memory, f"GPU {index}'s memory"
    else:
        raw = os.environ.get("LOCAL_WORLD_SIZE") or ""
        local = int(raw) if raw.isascii() and raw.isdigit() else world  # checked by check_launcher_env
        have, where = host_memory_bytes() // max(local, 1), f"this host's memory / {local} processes"
    if need > have:
        raise ValueError(f"--max-bytes/--p2p-bytes: the largest message needs about {need / 2**30:.1f} GiB per "
                         f"process ({world} ranks), more than {where} ({have / 2**30:.1f} GiB)")
