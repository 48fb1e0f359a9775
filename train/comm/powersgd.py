"""PowerSGD: torch's ``PowerSGDState`` with torch's ``powerSGD_hook`` or our sync-free variant.

``comm.powersgd_impl`` picks the hook:

* ``torch`` (default): torch's ``powerSGD_hook`` as shipped. Where its time goes on a GPU: per
  bucket it runs three collectives one after the other (the uncompressed tensors, P,
  Q) and, at the end of every bucket, ``torch.cuda.synchronize(device)``. DDP calls the
  hook from the autograd thread while the backward is still being queued, and NCCL
  futures run ``then`` callbacks inline, so that synchronize stalls the CPU until the
  GPU has drained *everything* queued so far, the remaining backward included: the
  backward of the next bucket cannot be launched before this bucket's three
  collectives have crossed the link. Compute and communication never overlap, and
  each bucket pays three link latencies in a row. For rank > 2 it also orthogonalises
  with ``torch.linalg.qr`` (cuSOLVER, one call per matrix).
* ``train`` (:func:`powersgd_hook` here): the same algorithm and state
  (``error_dict``, ``p_memory_dict``, ``q_memory_dict``, warm start, the same seeded Q
  initialisation), with (1) no synchronize: every tensor the chained callbacks touch
  lives in per-bucket buffers kept in the state, so nothing is freed while a
  collective or a callback on another stream may still read it (the hazard torch's
  synchronize guards against); (2) two collectives per bucket instead of three: the
  uncompressed tensors travel in the same all-reduce as P; (3) Gram-Schmidt
  orthogonalisation at every rank (no cuSOLVER calls; the same subspace as QR, so
  P·Qᵀ agrees with torch's to rounding). Tested against torch's hook on CPU
  (``tests/comm/test_comm_training.py::test_powersgd_matches_torch``).

Besides the hook this module has a call wrapper that reports the bytes the hook sends,
and the checkpoint adapter. ``PowerSGDState``'s
pickling drops the process group, so the adapter saves the tensors and counters that
make up the algorithm's state instead: the error-feedback residuals (``error_dict``),
the warm-start P/Q memories, the iteration counter and the numpy RNG that seeds Q.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import (
    PowerSGDState,
    _orthogonalize_gram_schmidt,
    _should_compress,
    powerSGD_hook,
)

from train.comm.resume import BucketStateCheckpoint

log = logging.getLogger(__name__)


IMPLS = ("train", "torch")


class State(PowerSGDState):
    """torch's state plus the per-bucket buffers of :func:`powersgd_hook`."""

    __slots__ = ("buffers",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.buffers: dict[int, _BucketBuffers] = {}


def make_state(cfg, process_group=None) -> PowerSGDState:
    return State(
        process_group=process_group,
        matrix_approximation_rank=cfg.powersgd_rank,
        start_powerSGD_iter=cfg.powersgd_start_iter,
        use_error_feedback=True,
        warm_start=cfg.powersgd_warm_start,
    )


class _BucketBuffers:
    """Per-bucket persistent buffers of :func:`powersgd_hook` (allocated once)."""

    def __init__(self, numel_u: int, numel_p: int, numel_q: int, total: int, device, dtype):
        self.send = torch.empty(numel_u + numel_p, device=device, dtype=dtype)  # [uncompressed | P]
        self.numel_u = numel_u
        self.q = torch.empty(numel_q, device=device, dtype=dtype)
        self.copy = torch.empty(total, device=device, dtype=dtype)  # gradient + error, before compression

    @property
    def p(self) -> torch.Tensor:
        return self.send[self.numel_u:]


def _split_bucket(state: State, bucket) -> tuple[list, list, list]:
    """The bucket's gradients as (matrices to compress, tensors sent as they are, (n, m, r)
    per compressed matrix); counts the elements before/after compression as torch does."""
    compress, plain, shapes = [], [], []
    for grad in bucket.gradients():
        matrix = grad.view(grad.shape[0], -1)
        n, m = matrix.shape
        r = min(n, m, state.matrix_approximation_rank)
        ok, before, after = _should_compress(n, m, r, state.min_compression_rate)
        state.total_numel_before_compression += before
        if ok:
            compress.append(matrix)
            shapes.append((n, m, r))
            state.total_numel_after_compression += after
        else:
            plain.append(grad)
            state.total_numel_after_compression += before
    return compress, plain, shapes


def _bucket_buffers(state: State, index: int, buf: torch.Tensor, plain: list, shapes: list) -> _BucketBuffers:
    """The bucket's persistent buffers (re-made when its layout changed)."""
    numel_u = sum(t.numel() for t in plain)
    numel_p = sum(n * r for n, _, r in shapes)
    numel_q = sum(m * r for _, m, r in shapes)
    bb = state.buffers.get(index)
    if bb is None or bb.copy.numel() != buf.numel() or bb.q.numel() != numel_q or bb.numel_u != numel_u:
        bb = state.buffers[index] = _BucketBuffers(numel_u, numel_p, numel_q, buf.numel(), buf.device, buf.dtype)
    return bb


def _low_rank_factors(state: State, index: int, bb: _BucketBuffers, shapes: list, eps: float):
    """Views of P and Q per matrix in the bucket's buffers; Q warm-started from its memory
    (restored checkpoints are copied in) or freshly seeded as torch seeds it, orthogonalised."""
    fresh = not state.warm_start or index not in state.q_memory_dict
    if not fresh and state.q_memory_dict[index] is not bb.q:
        bb.q.copy_(state.q_memory_dict[index])
    state.p_memory_dict[index], state.q_memory_dict[index] = bb.p, bb.q
    ps, qs, p_off, q_off = [], [], 0, 0
    for n, m, r in shapes:
        ps.append(bb.p[p_off:p_off + n * r].view(1, n, r))
        qs.append(bb.q[q_off:q_off + m * r].view(1, m, r))
        p_off, q_off = p_off + n * r, q_off + m * r
    if fresh:
        with torch.random.fork_rng(devices=[]):  # torch's seeding: same Q on every rank
            torch.manual_seed(state.rng.randint(1_000_000_000))
            for q in qs:
                q.copy_(torch.randn(*q.shape, device="cpu", dtype=bb.q.dtype))
    for q in qs:
        _orthogonalize_gram_schmidt(q, eps)
    return ps, qs


def powersgd_hook(state: State, bucket) -> torch.futures.Future:
    """torch's PowerSGD algorithm without the per-bucket synchronize, in two collectives
    per bucket (module docstring). Same state object and semantics as ``powerSGD_hook``."""
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    world = group.size()
    buf = bucket.buffer()
    if state.iter < state.start_powerSGD_iter:
        state.maybe_increase_iter(bucket)
        return default_hooks._allreduce_fut(group, buf)

    index = bucket.index()
    eps = max(state.orthogonalization_epsilon, 1e-8)  # a zero gradient column must not give NaN
    compress, plain, shapes = _split_bucket(state, bucket)
    bb = _bucket_buffers(state, index, buf, plain, shapes)
    numel_u = bb.numel_u

    # error feedback: acc = grad + error; bb.copy keeps acc until the error is known
    if state.use_error_feedback:
        err = state.error_dict.get(index)
        if err is None:
            state.error_dict[index] = torch.zeros_like(buf)
        else:
            buf.add_(err)
        bb.copy.copy_(buf)

    ps, qs = _low_rank_factors(state, index, bb, shapes, eps)
    mats = [t.unsqueeze(0) for t in compress]
    for mat, q, p in zip(mats, qs, ps):
        torch.bmm(mat, q, out=p)
    if plain:
        torch.cat([t.reshape(-1) for t in plain], out=bb.send[:numel_u])
    fut_p = dist.all_reduce(bb.send, group=group, async_op=True).get_future()

    def compute_q(fut):
        sent = fut.value()[0]
        if plain:
            sent[:numel_u].div_(world)
            off = 0
            for t in plain:
                t.copy_(sent[off:off + t.numel()].view_as(t))
                off += t.numel()
        for p in ps:
            _orthogonalize_gram_schmidt(p, eps)
        for mat, p, q in zip(mats, ps, qs):
            torch.bmm(mat.transpose(1, 2), p, out=q)
        return dist.all_reduce(bb.q, group=group, async_op=True).get_future().wait()[0]

    def decompress(fut):
        bb.q.div_(world)
        for p, q, mat in zip(ps, qs, mats):
            torch.bmm(p, q.transpose(1, 2), out=mat)
        if state.use_error_feedback:
            torch.sub(bb.copy, buf, out=state.error_dict[index])
        if not state.warm_start:
            state.p_memory_dict.pop(index, None)
            state.q_memory_dict.pop(index, None)
        state.maybe_increase_iter(bucket)
        return buf

    return fut_p.then(compute_q).then(decompress)


def _drop_mismatched(state: PowerSGDState, index: int, numel: int) -> None:
    err = state.error_dict.get(index)
    if err is not None and err.numel() != numel:
        log.warning("PowerSGD: bucket %d changed size (%d -> %d); its saved state is dropped",
                    index, err.numel(), numel)
        for d in (state.error_dict, state.p_memory_dict, state.q_memory_dict):
            d.pop(index, None)


def powersgd_call_factory(impl: str = "train"):
    """A ``call(state, bucket) -> (future, bytes_sent)`` around torch's hook; bytes come
    from torch's own element counters.

    torch's hook chains three collectives per bucket through ``Future.then``. NCCL
    futures complete at launch, so the chain runs inline and every rank issues the
    collectives in the same order. Gloo futures complete on gloo's own threads, so with
    several buckets the chains of different buckets could interleave differently on
    different ranks (mismatched collectives: a hang). On CPU each bucket therefore waits
    for the previous bucket's chain first (no overlap on CPU; GPUs are unaffected)."""
    previous = []

    def powersgd_call(state: PowerSGDState, bucket):
        buf = bucket.buffer()
        if not buf.is_cuda and previous:
            previous.pop().wait()
        compressing = state.iter >= state.start_powerSGD_iter
        if compressing:
            _drop_mismatched(state, bucket.index(), buf.numel())
        before = state.total_numel_after_compression
        fut = (powersgd_hook if impl == "train" else powerSGD_hook)(state, bucket)
        if not buf.is_cuda and not bucket.is_last():
            previous.append(fut)
        numel = state.total_numel_after_compression - before if compressing else buf.numel()
        return fut, numel * buf.element_size()

    return powersgd_call


def _rng_state(rng) -> dict:
    """numpy RandomState as plain values and a tensor (loadable with weights_only=True)."""
    name, keys, pos, has_gauss, cached = rng.get_state()
    return {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def _set_rng_state(rng, st: dict) -> None:
    rng.set_state((st["name"], st["keys"].numpy().astype(np.uint32), st["pos"], st["has_gauss"],
                   st["cached_gaussian"]))


def checkpoint(state: PowerSGDState, device: torch.device) -> BucketStateCheckpoint:
    def cpu(d):
        return {int(i): t.detach().cpu().clone() for i, t in d.items()}

    def dump() -> dict:
        return {
            "iter": state.iter,
            "error_dict": cpu(state.error_dict),
            "p_memory_dict": cpu(state.p_memory_dict),
            "q_memory_dict": cpu(state.q_memory_dict),
            "rng": _rng_state(state.rng),
            "total_numel_before_compression": state.total_numel_before_compression,
            "total_numel_after_compression": state.total_numel_after_compression,
        }

    def restore(sd: dict) -> None:
        state.iter = int(sd["iter"])
        for name in ("error_dict", "p_memory_dict", "q_memory_dict"):
            setattr(state, name, {int(i): t.to(device) for i, t in sd[name].items()})
        _set_rng_state(state.rng, sd["rng"])
        state.total_numel_before_compression = sd["total_numel_before_compression"]
        state.total_numel_after_compression = sd["total_numel_after_compression"]

    return BucketStateCheckpoint(dump, restore, state.process_group)
