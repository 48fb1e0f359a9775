"""Checks that need the world size or the machine but no process group.

Run by ``train run`` before ``init_process_group``: a bad mesh, an indivisible batch or
FP8 on a machine that cannot run it is reported as one line naming the key (exit 2)
before anything is allocated.
"""

from __future__ import annotations

import os
from pathlib import Path

from train.config import ConfigError, JobConfig
from train.parallel.config import check_parallel, resolve_mesh
from train.precision.fp8 import check_float8


def world_size_from_env() -> int:
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise ConfigError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not an integer") from None


def check_job(job: JobConfig, world_size: int) -> None:
    _, _, tp = resolve_mesh(job.parallel, world_size, job.model.n_heads, job.model.kv_heads)
    check_parallel(job, world_size)
    check_float8(job, world_size)
    dp = world_size // tp
    gbs = job.train.global_batch_size
    per_step = job.train.batch_size * dp
    if gbs and gbs % per_step:
        raise ConfigError(
            f"train.global_batch_size: {gbs} is not divisible by batch_size x dp ranks = "
            f"{job.train.batch_size} x {dp} = {per_step}"
        )


def check_out_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a directory")
    probe = out
    while not probe.exists():
        probe = probe.parent
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out}: {probe} is not writable")
