"""Training metrics: loss, throughput, MFU, step time, memory.

MFU = (tokens/s per GPU x FLOPs per token) / peak dense BF16 FLOP/s of the GPU, with
FLOPs per token = 6 N + 12 L d s (see ``train.models.llama.flops_per_token``). The
peak comes from ``train.hardware`` or ``metrics.peak_tflops``.

Rank 0 writes ``OUT/metrics.jsonl``: one JSON object per logged step.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from core.safety import check_output_target, parse_json

log = logging.getLogger(__name__)
TAIL_BYTES = 1 << 20  # a row is a few hundred bytes
MAX_SCAN_BYTES = 256 << 20  # larger files: only the partial last line is repaired on resume


def mfu(tokens_per_s_per_gpu: float, flops_per_token: float, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation: achieved FLOP/s per GPU over the peak; None without a peak."""
    if not peak_tflops:
        return None
    return tokens_per_s_per_gpu * flops_per_token / (peak_tflops * 1e12)


class StepTimer:
    """Wall time of a step. ``sync``: wait for the device at the end, so all queued GPU work is
    counted in this step. Without it the step ends where the host last waited for the device; in
    a loop that waits once per step that is the period of the steady state, the work still queued
    at the end (the optimizer) counted in the next step."""

    def __init__(self, device: torch.device, sync: bool = True):
        self.device = device
        self.sync = sync
        self.t0 = 0.0

    def start(self) -> None:
        self.t0 = time.perf_counter()

    def stop(self) -> float:
        if self.sync and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - self.t0


def peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return 0.0


def allocator_stats(device: torch.device) -> dict:
    """This rank's caching allocator so far: its peak reserved memory and how often a cudaMalloc
    failed and the allocator freed its cache to retry (each one a device sync); {} off CUDA."""
    if device.type != "cuda":
        return {}
    return {"reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30,
            "alloc_retries": int(torch.cuda.memory_stats(device).get("num_alloc_retries", 0))}


class ProgressBar:
    """A rich progress bar on rank 0 when stdout is a terminal; silent otherwise."""

    def __init__(self, enabled: bool, total: int, start: int):
        self.bar = None
        if enabled and sys.stdout.isatty():
            try:
                from rich.progress import (
                    BarColumn,
                    Progress,
                    TextColumn,
                    TimeRemainingColumn,
                )
            except ImportError:
                return
            self.bar = Progress(TextColumn("train"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                TextColumn("loss {task.fields[loss]}"), TimeRemainingColumn(), transient=True)
            self.task = self.bar.add_task("train", total=total, completed=start, loss="-")
            self.bar.start()

    def update(self, step: int, loss: float) -> None:
        if self.bar:
            self.bar.update(self.task, completed=step, loss=f"{loss:.4f}")

    def close(self) -> None:
        if self.bar:
            self.bar.stop()


class MetricsLogger:
    def __init__(self, out_dir: Path | None, enabled: bool, flops_per_token: float,
                 peak_tflops: float | None, world_size: int, tensorboard: bool = False,
                 keep_up_to_step: int | None = None, sinks=()):
        self.enabled = enabled
        self._sinks = list(sinks) if enabled else []  # train.exporters: Prometheus textfile, W&B
        self.flops_per_token = flops_per_token
        self.peak_tflops = peak_tflops
        self.world_size = world_size
        self.path = out_dir / "metrics.jsonl" if (out_dir and enabled) else None
        self._fd = None
        if self.path:
            out_dir.mkdir(parents=True, exist_ok=True)
            self._fd = open_rows(self.path, keep_up_to_step)
        self._tb = None
        if tensorboard and enabled and out_dir:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(out_dir / "tb"))
            except ImportError:
                log.warning("metrics.tensorboard=true but the tensorboard package is not installed; skipping")

    def mfu(self, tokens_per_s_per_gpu: float) -> float | None:
        """MFU of this run at ``tokens_per_s_per_gpu`` (None without a peak)."""
        return mfu(tokens_per_s_per_gpu, self.flops_per_token, self.peak_tflops)

    def record(self, step: int, loss: float, tokens: int, step_time: float, lr: float,
               grad_norm: float, peak_mem_gib: float, **extra) -> dict:
        """``tokens`` is the global token count of the step (all ranks)."""
        tps = tokens / step_time if step_time > 0 else 0.0
        per_gpu = tps / self.world_size
        row = {
            "step": step,
            "loss": loss,
            "tokens_per_s": tps,
            "tokens_per_s_per_gpu": per_gpu,
            "step_time_s": step_time,
            "lr": lr,
            "grad_norm": grad_norm,
            "peak_mem_gib": peak_mem_gib,
            "mfu": self.mfu(per_gpu),
            **extra,
        }
        if self._fd is not None:
            append_row(self._fd, row)
        if self._tb:
            for k, v in row.items():
                if isinstance(v, (int, float)) and k != "step":
                    self._tb.add_scalar(k, v, step)
        for sink in self._sinks:
            sink.log(row)
        return row

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._tb:
            self._tb.close()
        for sink in self._sinks:
            sink.close()
        self._sinks = []


def open_rows(path: Path, keep_up_to_step: int | None = None) -> int:
    """Open ``metrics.jsonl`` for appending whole rows; returns the file descriptor.

    A partial last line (what a full disk or a kill leaves) is cut off, and on resume the
    rows after the checkpoint's step (they are trained again) are dropped, so the file
    always parses line by line. Only a regular file is written (no FIFO/symlink/device),
    and only one of this run's own: a file with other hard links (``cp -al`` of a run) is
    copied first - the kept rows into a new file renamed over this name - so the other
    names keep their contents."""
    check_output_target(path, "metrics.jsonl")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        size = os.fstat(fd).st_size
        keep = _rows_to_keep(fd, size, keep_up_to_step) if size else 0
        if os.fstat(fd).st_nlink > 1:
            fd = _unshare(path, fd, keep)
            log.warning("%s had other hard links (a copy of another run?): continuing in a copy of its own; "
                        "the other names keep the rows as they were", path)
        elif keep != size:
            os.ftruncate(fd, keep)
        if keep != size:
            log.warning("%s: dropped %d bytes after the last complete row%s", path, size - keep,
                        f" / after step {keep_up_to_step}" if keep_up_to_step is not None else "")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _rows_to_keep(fd: int, size: int, keep_up_to_step: int | None) -> int:
    """How many leading bytes of the file are whole rows (up to ``keep_up_to_step``)."""
    if keep_up_to_step is None or size > MAX_SCAN_BYTES:  # the partial last line only
        offset = max(size - TAIL_BYTES, 0)
        data = os.pread(fd, size - offset, offset)
        cut = data.rfind(b"\n")
        return offset + cut + 1 if cut >= 0 else (0 if offset == 0 else size)
    data = os.pread(fd, size, 0)
    keep = data.rfind(b"\n") + 1  # whole lines only
    kept = 0
    for line in data[:keep].splitlines(keepends=True):
        try:
            step = parse_json(line).get("step")
        except (ValueError, AttributeError):
            step = None
        if isinstance(step, int) and step > keep_up_to_step:
            break
        kept += len(line)
    return kept


def _unshare(path: Path, fd: int, keep: int) -> int:
    """Copy the first ``keep`` bytes of ``fd`` into a new file in the same directory, rename
    it over ``path`` and return it open for appending; ``fd`` is closed. The inode other
    hard links share is never written."""
    new, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    try:
        offset = 0
        while offset < keep:
            chunk = os.pread(fd, min(16 << 20, keep - offset), offset)
            if not chunk:
                raise OSError(5, f"{path}: shrank while being copied")
            offset += os.write(new, chunk)
        os.fsync(new)
        os.chmod(tmp, os.fstat(fd).st_mode & 0o777)
        fcntl.fcntl(new, fcntl.F_SETFL, fcntl.fcntl(new, fcntl.F_GETFL) | os.O_APPEND)
        os.replace(tmp, path)
    except BaseException:
        os.close(new)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    return new


def append_row(fd: int, row: dict) -> None:
    """One ``write()`` per row; a short write (disk full) is rolled back to the last whole row."""
    data = (json.dumps(row, allow_nan=True) + "\n").encode()
    size = os.fstat(fd).st_size
    try:
        written = os.write(fd, data)
    except OSError:
        os.ftruncate(fd, size)
        raise
    if written != len(data):
        os.ftruncate(fd, size)
        raise OSError(28, f"metrics.jsonl: short write ({written} of {len(data)} bytes); row for step "
                          f"{row.get('step')} not recorded")


def read_metrics(path: Path) -> list[dict]:
    return [parse_json(line) for line in path.read_text().splitlines() if line.strip()]
