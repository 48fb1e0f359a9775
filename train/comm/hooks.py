"""DDP communication hooks selected by ``comm.hook``.

Uses torch's own hooks where torch ships them (``default_hooks`` fp16/bf16,
``powerSGD_hook``, ``post_localSGD_hook`` + ``PeriodicModelAverager``); Top-K lives in
``train.comm.topk``. Stateful hooks put a checkpoint adapter into ``par.extra_state``
(saved with every checkpoint, restored on resume); LocalSGD adds its parameter
averaging to ``par.after_optimizer_step``. With ``comm.measure`` every bucket goes
through :func:`train.comm.overlap.probed_hook` and each step's ``comm_bytes`` and
``exposed_comm_ms`` land in ``par.step_metrics`` (the trainer logs them).
"""

from __future__ import annotations

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from train.comm import powersgd, topk
from train.comm.localsgd import LocalSGD
from train.comm.overlap import CommProbe, probed_hook
from train.comm.resume import BucketStateCheckpoint


def allreduce_call(process_group, bucket):
    """torch's ``allreduce_hook`` (what DDP's built-in path does) with its byte count."""
    buf = bucket.buffer()
    return default_hooks.allreduce_hook(process_group, bucket), buf.numel() * buf.element_size()


def _half_call(torch_hook):
    def call(process_group, bucket):
        return torch_hook(process_group, bucket), bucket.buffer().numel() * 2

    call.__name__ = torch_hook.__name__
    return call


def register_comm_hook(ddp, cfg, par) -> None:
    """Register the configured hook on ``ddp``; stateful hooks add their state to
    ``par.extra_state`` (checkpointed) and step callbacks to ``par.after_optimizer_step``."""
    device = next(ddp.parameters()).device
    probe = CommProbe(device) if cfg.measure else None
    if probe is not None:
        par.step_metrics.append(probe.collect)

    if cfg.hook == "none":
        if probe is not None:  # DDP's built-in all-reduce has no hook to time; torch's equivalent does
            ddp.register_comm_hook(None, probed_hook(allreduce_call, probe))
    elif cfg.hook in ("fp16", "bf16"):
        torch_hook = default_hooks.fp16_compress_hook if cfg.hook == "fp16" else default_hooks.bf16_compress_hook
        if probe is None:
            ddp.register_comm_hook(None, torch_hook)
        else:
            ddp.register_comm_hook(None, probed_hook(_half_call(torch_hook), probe))
    elif cfg.hook == "powersgd":
        state = powersgd.make_state(cfg)
        ckpt = powersgd.checkpoint(state, device)
        par.extra_state["comm_powersgd"] = ckpt
        ddp.register_comm_hook(state, probed_hook(ckpt.wrap(powersgd.powersgd_call_factory(cfg.powersgd_impl)), probe))
    elif cfg.hook == "topk":
        state = topk.TopKState(ratio=cfg.topk_ratio, start_iter=cfg.topk_start_iter)
        ckpt = BucketStateCheckpoint(state.state_dict, lambda sd: state.load_state_dict(sd, device))
        par.extra_state["comm_topk"] = ckpt
        ddp.register_comm_hook(state, probed_hook(ckpt.wrap(topk.topk_call), probe))
    elif cfg.hook == "localsgd":
        local = LocalSGD(cfg.localsgd_period, cfg.localsgd_warmup)
        par.extra_state["comm_localsgd"] = local
        ddp.register_comm_hook(local.hook_state, probed_hook(LocalSGD.call, probe))
        params = list(ddp.module.parameters())
        par.after_optimizer_step.append(lambda: local.after_optimizer_step(params, probe))
    else:  # CommConfig.validate rejects anything else first
        raise ValueError(f"comm.hook: unknown hook {cfg.hook!r}")
