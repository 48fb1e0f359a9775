"""Top-K gradient sparsification with error feedback, as a DDP communication hook.

Per bucket and step, on every rank:

1. ``acc = gradient + residual`` (the residual is what earlier steps did not send);
2. keep the ``k = ceil(ratio * numel)`` entries of ``acc`` with the largest magnitude;
3. the new residual is ``acc`` with those entries zeroed (error feedback: nothing is
   lost, it is only delayed);
4. all ranks all-gather the (values, int32 indices) pairs, packed into one byte
   buffer so that one collective carries both; each rank scatter-adds every rank's
   pairs into a zero tensor, in rank order, and divides by the world size.

Indices within one rank are unique, so the scatter-add of each rank's pairs has no
collisions and the sum is deterministic: all ranks compute bit-identical gradients.

Before ``start_iter`` the hook runs a plain all-reduce (DDP rebuilds its buckets after
the first step; the residuals are keyed by bucket index, so they start afterwards).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks


class TopKState:
    def __init__(self, process_group=None, ratio: float = 0.01, start_iter: int = 10):
        if not 0 < ratio <= 1:
            raise ValueError(f"ratio must be in (0, 1], got {ratio}")
        self.process_group = process_group
        self.ratio = ratio
        self.start_iter = start_iter
        self.iter = 0
        self.residuals: dict[int, torch.Tensor] = {}
        self.bytes_sent = 0  # cumulative bytes handed to collectives by this rank

    def k_for(self, numel: int) -> int:
        return max(1, min(numel, math.ceil(self.ratio * numel)))

    def state_dict(self) -> dict:
        return {
            "iter": self.iter,
            "ratio": self.ratio,
            "residuals": {i: r.detach().cpu().clone() for i, r in self.residuals.items()},
        }

    def load_state_dict(self, sd: dict, device: torch.device) -> None:
        self.iter = int(sd["iter"])
        self.residuals = {int(i): r.to(device) for i, r in sd["residuals"].items()}


def select_topk(grad: torch.Tensor, residual: torch.Tensor, k: int):
    """``(values, indices, new_residual)``: the ``k`` largest-magnitude entries of
    ``grad + residual`` and what is left of the sum once they are sent."""
    acc = grad + residual
    indices = acc.abs().topk(k, sorted=False).indices
    values = acc[indices]
    acc[indices] = 0
    return values, indices, acc


def pack(values: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """One byte buffer: the values (in their dtype) followed by int32 indices."""
    return torch.cat([values.contiguous().view(torch.uint8), indices.to(torch.int32).view(torch.uint8)])


def unpack_sum(gathered: torch.Tensor, world: int, k: int, dtype: torch.dtype, numel: int) -> torch.Tensor:
    """Sum of all ranks' sparse tensors from the all-gathered packed buffers."""
    rows = gathered.view(world, -1)
    vbytes = k * torch.empty((), dtype=dtype).element_size()
    out = torch.zeros(numel, dtype=dtype, device=gathered.device)
    for r in range(world):  # rank order: identical on every rank
        # clone: a fresh, aligned buffer for each reinterpretation (a slice's byte offset
        # need not be a multiple of the element size, e.g. bf16 values with an odd k)
        vals = rows[r, :vbytes].clone().view(dtype)
        idx = rows[r, vbytes:].clone().view(torch.int32).long()
        out[idx] += vals  # unique indices within a rank: no collisions
    return out


def topk_call(state: TopKState, bucket):
    """``(future, bytes_sent)`` for one bucket (see ``train.comm.overlap.probed_hook``)."""
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    buf = bucket.buffer()
    if state.iter < state.start_iter:
        if bucket.is_last():
            state.iter += 1
        nbytes = buf.numel() * buf.element_size()
        state.bytes_sent += nbytes
        return default_hooks.allreduce_hook(group, bucket), nbytes

    index = bucket.index()
    residual = state.residuals.get(index)
    if residual is None or residual.numel() != buf.numel() or residual.dtype != buf.dtype:
        residual = torch.zeros_like(buf)
    k = state.k_for(buf.numel())
    values, indices, state.residuals[index] = select_topk(buf, residual, k)
    payload = pack(values, indices)
    gathered = torch.empty(world * payload.numel(), dtype=torch.uint8, device=buf.device)
    fut = dist.all_gather_into_tensor(gathered, payload, group=group, async_op=True).get_future()
    if bucket.is_last():
        state.iter += 1
    state.bytes_sent += payload.numel()
    dtype, numel = buf.dtype, buf.numel()

    def decompress(f):
        f.wait()
        return unpack_sum(gathered, world, k, dtype, numel).div_(world)

    return fut.then(decompress), payload.numel()


def topk_hook(state: TopKState, bucket):
    """Plain DDP comm hook form: ``ddp.register_comm_hook(TopKState(...), topk_hook)``."""
    return topk_call(state, bucket)[0]
