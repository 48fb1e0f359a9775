"""Sum all-reduce of a few numbers per step (``comm.small_reduce``): NCCL or symmetric memory.

The trainer agrees once per step on a 4-float vector (loss, NaN, preemption, checkpoint
written). At that size an all-reduce is pure latency. ``comm.small_reduce=symm_mem`` runs it
as torch's symmetric-memory one-shot all-reduce (``torch.ops.symm_mem.one_shot_all_reduce``:
one kernel that reads every peer's buffer over NVLink, no NCCL launch); ``nccl`` (default)
is ``dist.all_reduce`` on the process group (gloo on CPU).

:class:`SmallReduce` allocates one symmetric buffer per (group, size, dtype) once
(``symm_mem.empty`` + ``rendezvous``, a collective). Whether symmetric memory is usable is
agreed by all ranks (one NCCL all-reduce at set-up); when it is not (CPU, gloo, no P2P,
an older torch without the ops) every rank falls back to NCCL with a logged warning.

Multicast (NVLS) is never used: only the one-shot kernel, which reads peers through P2P
pointers; ``TORCH_SYMM_MEM_DISABLE_MULTICAST`` is set to 1 before the rendezvous unless the
environment already sets it. Every rank reduces the peers' values in rank order, so all
ranks get bit-identical sums (the agreement needs that).
"""

from __future__ import annotations

import logging
import os
import warnings

import torch
import torch.distributed as dist

IMPLS = ("nccl", "symm_mem")
log = logging.getLogger(__name__)


def symm_mem_unavailable(device: torch.device, group=None) -> str | None:
    """Why this rank cannot use symmetric memory on ``group`` (None: it can, as far as
    local checks tell)."""
    if device.type != "cuda":
        return "needs CUDA tensors"
    if not dist.is_initialized():
        return "needs a process group"
    if dist.get_backend(group) != "nccl":
        return f"needs the nccl backend (process group uses {dist.get_backend(group)})"
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if local is not None and local.isdigit() and int(local) < dist.get_world_size(group):
        return f"the group spans several nodes ({dist.get_world_size(group)} ranks, {local} per node): NVLink peers only"
    try:
        import torch.distributed._symmetric_memory
    except ImportError as exc:
        return f"torch.distributed._symmetric_memory: {exc}"
    if not hasattr(torch.ops, "symm_mem") or not hasattr(torch.ops.symm_mem, "one_shot_all_reduce"):
        return "this torch has no torch.ops.symm_mem.one_shot_all_reduce"
    return None


def rendezvous_buffer(numel: int, dtype: torch.dtype, device: torch.device, group=None) -> tuple[torch.Tensor, str]:
    """A symmetric buffer of ``numel`` elements on every rank of ``group`` (a collective):
    (buffer, group name for the ``torch.ops.symm_mem`` kernels)."""
    import torch.distributed._symmetric_memory as symm_mem

    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    group = group or dist.group.WORLD
    name = group.group_name
    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
    if enable is not None:  # needed up to torch 2.8 or so, deprecated (a no-op) since
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            enable(name)
    buf = symm_mem.empty(numel, dtype=dtype, device=device)
    symm_mem.rendezvous(buf, group)
    return buf, name


def _agreed(ok: bool, device: torch.device, group) -> bool:
    flag = torch.tensor([0.0 if ok else 1.0], device=device)
    dist.all_reduce(flag, group=group)
    return flag.item() == 0


class SmallReduce:
    """``reduce(vec)`` -> the element-wise sum of ``vec`` over the ranks of ``group``."""

    def __init__(self, impl: str, numel: int, dtype: torch.dtype, device: torch.device, group=None):
        if impl not in IMPLS:
            raise ValueError(f"comm.small_reduce: must be one of {', '.join(IMPLS)}, got {impl!r}")
        self.group = group
        self.impl = "nccl"
        self.buf = None
        if impl == "symm_mem":
            self._set_up(numel, dtype, device)

    def _set_up(self, numel: int, dtype: torch.dtype, device: torch.device) -> None:
        # The local checks give the same answer on every rank (same torch, same group);
        # only the rendezvous can fail on some ranks, so its outcome is agreed on.
        why = symm_mem_unavailable(device, self.group)
        if why is None:
            try:
                self.buf, self.group_name = rendezvous_buffer(numel, dtype, device, self.group)
            except (RuntimeError, ValueError, TypeError) as exc:
                why = f"rendezvous failed: {' '.join(str(exc).split())[:200]}"
            if not _agreed(why is None, device, self.group):
                self.buf = None
                why = why or "another rank could not set it up"
        if self.buf is None:
            log.warning("comm.small_reduce=symm_mem: symmetric memory unavailable (%s); using NCCL", why)
            return
        self.impl = "symm_mem"
        self._copy = hasattr(torch.ops.symm_mem, "one_shot_all_reduce_copy")

    def __call__(self, vec: torch.Tensor) -> torch.Tensor:
        if self.buf is None:
            dist.all_reduce(vec, group=self.group)
            return vec
        if self._copy:  # the copy into the symmetric buffer happens inside the kernel
            return torch.ops.symm_mem.one_shot_all_reduce_copy(self.buf, vec, "sum", self.group_name)
        self.buf.copy_(vec)
        return torch.ops.symm_mem.one_shot_all_reduce(self.buf, "sum", self.group_name)


_CACHE: dict[tuple, SmallReduce] = {}


def small_all_reduce(vec: torch.Tensor, impl: str, group=None) -> torch.Tensor:
    """Sum of ``vec`` over the ranks (returned; ``vec`` may be overwritten). The reducer of
    each (impl, group, shape, dtype, device) is built once per process group, at the first
    call (all ranks make it together, as every call)."""
    g = group or dist.group.WORLD
    key = (impl, id(g), getattr(g, "group_name", ""), vec.numel(), vec.dtype, vec.device)
    reducer = _CACHE.get(key)
    if reducer is None:
        reducer = _CACHE[key] = SmallReduce(impl, vec.numel(), vec.dtype, vec.device, group)
    return reducer(vec.reshape(-1)).view(vec.shape)
