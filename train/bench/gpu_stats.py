"""What ``train bench step`` measures of a point besides time: GPU memory, the worst rank's."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def reduce_max(values: list[float], info) -> list[float]:
    import torch
    import torch.distributed as dist

    if info.backend is None:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=info.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


class ForwardMemory:
    """Memory allocated by the forward pass and still held when it returns
    (saved activations + logits): hooks on the model's outermost module."""

    def __init__(self, model: torch.nn.Module, device: torch.device):
        self.device = device
        self.before = 0
        self.delta = 0
        self.handles = [model.register_forward_pre_hook(self._pre), model.register_forward_hook(self._post)]

    def _pre(self, module, args):
        import torch

        self.before = torch.cuda.memory_allocated(self.device)

    def _post(self, module, args, output):
        import torch

        self.delta = max(self.delta, torch.cuda.memory_allocated(self.device) - self.before)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def memory_columns(info, forward_delta: int) -> dict:
    """Peak allocated, the forward's activations, the allocator's own peak (reserved) and how often
    it freed its cache to retry a cudaMalloc (a device sync each): the worst rank's."""
    import torch

    retries = torch.cuda.memory_stats(info.device).get("num_alloc_retries", 0)
    peak, act, reserved, retries = reduce_max([torch.cuda.max_memory_allocated(info.device), forward_delta,
                                                torch.cuda.max_memory_reserved(info.device), retries], info)
    return {"peak_mem_gib": peak / 2**30, "act_mem_gib": act / 2**30, "reserved_gib": reserved / 2**30,
            "alloc_retries": int(retries)}
