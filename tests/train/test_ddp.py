"""DDP across 2 gloo processes computes the same gradients as one process on the
concatenated batch (with and without gradient accumulation through no_sync)."""

import contextlib

import torch
import torch.nn.functional as F

from testlib import spawn
from train.config import load_config
from train.distributed import DistInfo
from train.models.llama import Transformer
from train.parallel import parallelize

OVERRIDES = ["model.dim=64", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2"]


def _job():
    return load_config("tiny", OVERRIDES)


def _materialize(m):
    m.to_empty(device="cpu")
    m.init_weights(3)


def _batch(n=8, seq=16):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (n, seq + 1), generator=g)
    return x[:, :-1], x[:, 1:]


def _loss(model, x, y):
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten(0, 1))


def _reference_grads():
    job = _job()
    with torch.device("meta"):
        m = Transformer(job.model)
    _materialize(m)
    x, y = _batch()
    _loss(m, x, y).backward()
    return {n: p.grad.clone() for n, p in m.named_parameters()}


def _ddp_worker(rank, world, ref, accum):
    job = _job()
    with torch.device("meta"):
        m = Transformer(job.model)
    par = parallelize(m, job, DistInfo(rank, rank, world, torch.device("cpu"), "gloo"), _materialize)
    x, y = _batch()
    per_rank = x.shape[0] // world
    xs, ys = x[rank * per_rank:(rank + 1) * per_rank], y[rank * per_rank:(rank + 1) * per_rank]
    micro = per_rank // accum
    for i in range(accum):
        ctx = par.no_sync() if i < accum - 1 else contextlib.nullcontext()
        with ctx:
            (_loss(par.model, xs[i * micro:(i + 1) * micro], ys[i * micro:(i + 1) * micro]) / accum).backward()
    for n, p in par.inner.named_parameters():
        torch.testing.assert_close(p.grad, ref[n], rtol=1e-5, atol=1e-6, msg=lambda s: f"{n}: {s}")


def test_ddp_grads_equal_single_process_large_batch():
    spawn(_ddp_worker, 2, _reference_grads(), 1)


def test_ddp_grad_accumulation_with_no_sync():
    spawn(_ddp_worker, 2, _reference_grads(), 2)
