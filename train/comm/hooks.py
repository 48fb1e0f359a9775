"""DDP communication hooks selected by ``comm.hook``.

Uses torch's own hooks (``default_hooks``) where torch ships them.
"""

from __future__ import annotations

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks


def register_comm_hook(ddp, cfg, par) -> None:
    """Register the configured hook on ``ddp``; stateful hooks add their state to
    ``par.extra_state`` (checkpointed) and step callbacks to ``par.after_optimizer_step``."""
    if cfg.hook == "none":
        return
    if cfg.hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif cfg.hook == "bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    else:
        raise NotImplementedError(f"comm.hook={cfg.hook} is not available in this build")
