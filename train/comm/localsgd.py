"""Local SGD: torch's post-local SGD hook plus ``PeriodicModelAverager``.

For ``localsgd_warmup`` steps DDP all-reduces gradients as usual. Afterwards the hook
exchanges nothing (``post_local_gradient_allreduce=False``: torch's default would
all-reduce within each node's subgroup, which on one node is the whole world), every
rank steps on its own gradients, and after every ``localsgd_period``-th optimizer step
the parameters are averaged across ranks. Between averages the ranks' models differ.
"""

from __future__ import annotations

from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
    PostLocalSGDState,
    post_localSGD_hook,
)
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager


class LocalSGD:
    def __init__(self, period: int, warmup: int, process_group=None):
        self.hook_state = PostLocalSGDState(
            process_group=process_group, subgroup=None, start_localSGD_iter=warmup,
            post_local_gradient_allreduce=False,
        )
        self.averager = PeriodicModelAverager(period=period, warmup_steps=warmup, process_group=process_group)

    @staticmethod
    def call(state: PostLocalSGDState, bucket):
        """``(future, bytes_sent)``: a plain all-reduce during warm-up, nothing after."""
        local = state.iter >= state.start_localSGD_iter
        buf = bucket.buffer()
        return post_localSGD_hook(state, bucket), 0 if local else buf.numel() * buf.element_size()

    def averages_now(self) -> bool:
        """Whether the next ``average_parameters`` call communicates (torch's rule)."""
        a = self.averager
        return a.step >= a.warmup_steps and (a.step - a.warmup_steps) % a.period == 0

    def after_optimizer_step(self, params, probe=None) -> None:
        params = [p for p in params if p.requires_grad]
        if probe is None or not self.averages_now():
            self.averager.average_parameters(params)
            return
        nbytes = sum(p.numel() * p.element_size() for p in params)
        probe.timed(lambda: self.averager.average_parameters(params), nbytes)

    # checkpoint (par.extra_state)
    def state_dict(self) -> dict:
        return {"iter": self.hook_state.iter, "averager_step": self.averager.step}

    def load_state_dict(self, sd: dict) -> None:
        self.hook_state.iter = int(sd["iter"])
        self.averager.step = int(sd["averager_step"])
