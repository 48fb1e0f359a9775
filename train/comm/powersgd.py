"""PowerSGD through torch's own ``PowerSGDState`` / ``powerSGD_hook``.

Only the glue lives here: a call wrapper that reports the bytes the hook sends (taken
from torch's own element counters), and the checkpoint adapter. ``PowerSGDState``'s
pickling drops the process group, so the adapter saves the tensors and counters that
make up the algorithm's state instead: the error-feedback residuals (``error_dict``),
the warm-start P/Q memories, the iteration counter and the numpy RNG that seeds Q.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook

from train.comm.resume import BucketStateCheckpoint

log = logging.getLogger(__name__)


def make_state(cfg, process_group=None) -> PowerSGDState:
    return PowerSGDState(
        process_group=process_group,
        matrix_approximation_rank=cfg.powersgd_rank,
        start_powerSGD_iter=cfg.powersgd_start_iter,
        use_error_feedback=True,
        warm_start=cfg.powersgd_warm_start,
    )


def _drop_mismatched(state: PowerSGDState, index: int, numel: int) -> None:
    err = state.error_dict.get(index)
    if err is not None and err.numel() != numel:
        log.warning("PowerSGD: bucket %d changed size (%d -> %d); its saved state is dropped",
                    index, err.numel(), numel)
        for d in (state.error_dict, state.p_memory_dict, state.q_memory_dict):
            d.pop(index, None)


def powersgd_call_factory():
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
        fut = powerSGD_hook(state, bucket)
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
