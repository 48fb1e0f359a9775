"""Training metrics: loss, throughput, MFU, step time, memory.

MFU = (tokens/s per GPU x FLOPs per token) / peak dense BF16 FLOP/s of the GPU, with
FLOPs per token = 6 N + 12 L d s (see ``train.models.llama.flops_per_token``). The
peak comes from ``train.hardware`` or ``metrics.peak_tflops``.

Rank 0 writes ``OUT/metrics.jsonl``: one JSON object per logged step.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch


class StepTimer:
    """Wall time of a step; synchronises the device so queued GPU work is counted."""

    def __init__(self, device: torch.device):
        self.device = device
        self.t0 = 0.0

    def start(self) -> None:
        self.t0 = time.perf_counter()

    def stop(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - self.t0


def peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return 0.0


class MetricsLogger:
    def __init__(self, out_dir: Path | None, enabled: bool, flops_per_token: float,
                 peak_tflops: float | None, world_size: int, tensorboard: bool = False, sinks=()):
        self.enabled = enabled
        self._sinks = list(sinks) if enabled else []  # train.exporters: Prometheus textfile, W&B
        self.flops_per_token = flops_per_token
        self.peak_tflops = peak_tflops
        self.world_size = world_size
        self.path = out_dir / "metrics.jsonl" if (out_dir and enabled) else None
        if self.path:
            out_dir.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a") if self.path else None
        self._tb = None
        if tensorboard and enabled and out_dir:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(out_dir / "tb"))
            except ImportError:
                print("metrics.tensorboard=true but the tensorboard package is not installed; skipping")

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
            "mfu": (per_gpu * self.flops_per_token / (self.peak_tflops * 1e12)) if self.peak_tflops else None,
            **extra,
        }
        if self._fh:
            self._fh.write(json.dumps(row) + "\n")
            self._fh.flush()
        if self._tb:
            for k, v in row.items():
                if isinstance(v, (int, float)) and k != "step":
                    self._tb.add_scalar(k, v, step)
        for sink in self._sinks:
            sink.log(row)
        return row

    def close(self) -> None:
        if self._fh:
            self._fh.close()
        if self._tb:
            self._tb.close()
        for sink in self._sinks:
            sink.close()
        self._sinks = []


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
