"""Process-group setup from torchrun's environment (or a single process without it)."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str | None  # None when running as one process without a process group

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def pick_device(requested: str, local_rank: int) -> torch.device:
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("train.device=cuda but no CUDA GPU is visible (check CUDA_VISIBLE_DEVICES and the driver)")
    if local_rank >= torch.cuda.device_count():
        raise RuntimeError(
            f"LOCAL_RANK={local_rank} but only {torch.cuda.device_count()} GPU(s) are visible: "
            "--nproc-per-node is larger than the GPUs on this node"
        )
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def init_distributed(device_pref: str = "auto", timeout_s: int = 600) -> DistInfo:
    """Read RANK/LOCAL_RANK/WORLD_SIZE (set by torchrun) and start the process group.

    nccl on CUDA, gloo on CPU. ``timeout_s`` bounds every collective: a rank that stops
    answering ends the job with an error instead of a hang. Single process without
    torchrun: no process group at all.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_pref, local_rank)
    if world == 1 and "MASTER_ADDR" not in os.environ:
        return DistInfo(0, 0, 1, device, None)
    backend = "nccl" if device.type == "cuda" else "gloo"
    # Surface NCCL errors/timeouts as exceptions that tear the process down (torch >= 2.2 default is 3).
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    dist.init_process_group(
        backend=backend,
        timeout=datetime.timedelta(seconds=timeout_s),
        device_id=device if device.type == "cuda" else None,
    )
    return DistInfo(dist.get_rank(), local_rank, dist.get_world_size(), device, backend)


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    if info.backend is not None:
        if info.device.type == "cuda":
            dist.barrier(device_ids=[info.device.index])
        else:
            dist.barrier()
