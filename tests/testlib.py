"""Helpers to run real multi-process code in tests (gloo on CPU, NCCL on GPUs)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args: list[str], nproc: int = 2, extra_env: dict | None = None, timeout: float = 300,
             torchrun_args: list[str] | None = None) -> subprocess.CompletedProcess:
    """``torchrun --nproc-per-node N -m train <args>`` with a private rendezvous port."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
           *(torchrun_args or []), "-m", "train", *args]
    return run(cmd, extra_env, timeout)


def train_cli(args: list[str], extra_env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """One process, no torchrun: ``python -m train <args>``."""
    return run([sys.executable, "-m", "train", *args], extra_env, timeout)


def run(cmd: list[str], extra_env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra_env or {})
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def spawn(fn, world_size: int = 2, *args, timeout: float = 240) -> None:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` processes with a gloo
    process group already initialised; re-raises the first failure."""
    import torch.multiprocessing as mp

    port = free_port()
    mp.start_processes(_entry, args=(fn, world_size, port, args), nprocs=world_size, join=True,
                       start_method="spawn")


def _entry(rank: int, fn, world_size: int, port: int, args) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=120))
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()
