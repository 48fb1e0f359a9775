"""DistributedDataParallel with configurable buckets and communication hooks."""

from __future__ import annotations

import inspect

from torch.nn.parallel import DistributedDataParallel as DDP

from train.comm.hooks import register_comm_hook
from train.parallel.bundle import Parallelized


def _bucket_kwargs(pcfg) -> dict:
    """``bucket_cap_mb`` for every bucket; with ``first_bucket_mb`` the first bucket (the
    last layers, whose gradients are ready first) gets its own smaller cap so that
    communication starts earlier in the backward pass."""
    if not pcfg.first_bucket_mb:
        return {"bucket_cap_mb": pcfg.bucket_cap_mb}
    if "bucket_cap_mb_list" not in inspect.signature(DDP.__init__).parameters:
        raise RuntimeError("parallel.first_bucket_mb needs a torch whose DDP accepts bucket_cap_mb_list")
    return {"bucket_cap_mb_list": [pcfg.first_bucket_mb, pcfg.bucket_cap_mb]}


def apply_ddp(model, job, info, materialize, dims=None):
    """``dims`` is accepted for a uniform strategy signature; DDP replicates over every rank."""
    materialize(model)
    pcfg = job.parallel
    kwargs = dict(
        gradient_as_bucket_view=pcfg.gradient_as_bucket_view,
        static_graph=pcfg.static_graph,
        **_bucket_kwargs(pcfg),
    )
    if info.device.type == "cuda":
        kwargs["device_ids"] = [info.device.index]
    ddp = DDP(model, **kwargs)
    par = Parallelized(model=ddp, inner=model, dp_rank=info.rank, dp_world=info.world_size, no_sync=ddp.no_sync)
    register_comm_hook(ddp, job.comm, par)
    return par
