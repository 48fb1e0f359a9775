"""Checkpointing of hook state that is keyed by DDP bucket index (PowerSGD, Top-K).

A freshly built DDP assigns parameters to buckets in reverse registration order for its
first step and rebuilds the buckets in gradient-ready order after it. Saved residuals
and low-rank memories belong to the rebuilt buckets, so on resume they cannot be used
in the first step. :class:`BucketStateCheckpoint` keeps the loaded state pending, runs
that first step with a plain all-reduce, and installs the state at its end; from the
second step on the buckets match the saved ones again.
"""

from __future__ import annotations

from typing import Any, Callable

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks


class BucketStateCheckpoint:
    """A ``par.extra_state`` entry: ``state_dict()`` / ``load_state_dict()``.

    ``dump()`` returns the live hook state as a checkpointable dict; ``restore(sd)``
    installs one. ``wrap(call)`` guards a hook ``call(state, bucket) -> (future, bytes)``."""

    def __init__(self, dump: Callable[[], dict], restore: Callable[[dict], None], process_group=None):
        self.dump = dump
        self.restore = restore
        self.process_group = process_group
        self.pending: dict[str, Any] | None = None

    def state_dict(self) -> dict:
        return self.pending if self.pending is not None else self.dump()

    def load_state_dict(self, sd: dict) -> None:
        self.pending = sd

    def wrap(self, call):
        def guarded(state, bucket):
            if self.pending is None:
                return call(state, bucket)
            buf = bucket.buffer()
            fut = default_hooks.allreduce_hook(self.process_group, bucket)
            if bucket.is_last():
                pending, self.pending = self.pending, None
                self.restore({**pending, "iter": int(pending["iter"]) + 1})  # this step counts
            return fut, buf.numel() * buf.element_size()

        guarded.__name__ = getattr(call, "__name__", "hook")
        return guarded
