"""When to checkpoint, and what: the training loop's side of :mod:`train.checkpoint`.

The trainer hands its state over once, as ``Stateful`` objects (:mod:`train.checkpoint.state`), and
calls :meth:`Checkpointer.maybe_save` after every step; the cadence lives here:

* every ``checkpoint.every`` steps (asynchronously with ``checkpoint.async_save``: the
  loop goes on while the write runs; the save is committed at the first step after which
  every rank's write has finished, or before the next save);
* at once, synchronously, when the ranks agreed to stop (preemption);
* at the end of the run (``checkpoint.final``), unless the newest checkpoint is already
  of the last step.

Before each save every rank checks that the parameters are finite: a NaN model is never
written over a good checkpoint.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from torch.distributed.checkpoint.stateful import Stateful

from train import distributed as tdist
from train.checkpoint.manager import CheckpointManager
from train.checkpoint.state import ModelOptimizer, Progress, load_per_rank_state, per_rank_state
from train.errors import CheckpointError, NonFiniteLossError
from train.trace import phase

log = logging.getLogger(__name__)


class Checkpointer:
    def __init__(self, manager: CheckpointManager, cfg, total_steps: int, shards: ModelOptimizer,
                 progress: Progress, per_rank: list[Stateful], info: tdist.DistInfo) -> None:
        self.manager = manager
        self.cfg = cfg  # the job's checkpoint section
        self.total_steps = total_steps
        self.shards = shards
        self.progress = progress
        self.per_rank = [progress, *per_rank]
        self.info = info
        self.last: str | None = None  # the newest checkpoint this run wrote (committed)

    def _info(self, msg: str) -> None:
        if self.info.is_main:
            log.info("%s", msg)

    # ------------------------------------------------------------------ cadence
    def maybe_save(self, step: int, *, written: bool = False, preempted: bool = False,
                   final: bool = False) -> str | None:
        """The checkpoint decision after step ``step`` finished; every rank calls it at the
        same point (collective). ``written``: every rank's async write has finished (agreed
        in the step's all_reduce); ``preempted``: the ranks agreed to stop; ``final``: the
        run reached its last step. Returns the newest checkpoint written so far."""
        if written or final:
            self.last = self.commit_written() or self.last  # final: waits for a write in flight
        if preempted:
            self.last = str(self.save(step))
        elif final:
            if self.cfg.final:
                latest = self.manager.latest()
                if latest is None or latest.name != f"step_{step:08d}":
                    self.last = str(self.save(step))
                else:
                    self.last = str(latest)
        elif self.cfg.every and step % self.cfg.every == 0 and step < self.total_steps:
            path = self.save(step, wait=False)
            if self.manager.in_flight is None:
                self.last = str(path)
        return self.last

    # ------------------------------------------------------------------ saving
    def params_finite(self) -> bool:
        """All parameters finite on every rank (checked before each checkpoint)."""
        ok = torch.ones((), dtype=torch.bool, device=self.info.device)
        for p in self.shards.model.parameters():
            t = p.detach()
            ok &= torch.isfinite(t.to_local() if hasattr(t, "to_local") else t).all()
        with tdist.collective("all_reduce (parameter finiteness check)"):
            return tdist.all_true(self.info, bool(ok.item()))

    def save(self, step: int, wait: bool = True) -> Path:
        """Checkpoint ``step`` now. ``wait=False`` with checkpoint.async_save returns once
        the state is staged; :meth:`commit_written` commits it later. The logged stall is
        all the time the loop spends here (incl. waiting for a previous write)."""
        t0 = time.perf_counter()
        if not self.params_finite():
            latest = self.manager.latest_local()
            where = f"last good checkpoint: {latest}" if latest else "no checkpoint was written"
            raise NonFiniteLossError(f"parameters are NaN/Inf after step {step}; checkpoint not written ({where})")
        extra = per_rank_state(self.per_rank)
        self.commit_written()  # at most one save in flight: finish the previous one first
        with phase("checkpoint"):
            path = self.manager.save(step, self.shards.model, self.shards.optimizer, extra, wait=wait)
        mode = "async" if self.manager.async_save else "sync"
        waited = " and waiting for the write" if mode == "async" and wait else ""
        self._info(f"checkpoint {path.name}: stall {(time.perf_counter() - t0) * 1000:.1f} ms ({mode}{waited})")
        if self.manager.in_flight is None:
            self._info(f"checkpoint saved: {path}")
        return path

    def commit_written(self) -> str | None:
        """Commit the async save whose write every rank has finished (or wait for it)."""
        t0 = time.perf_counter()
        path = self.manager.finish()
        if path is None:
            return None
        self._info(f"checkpoint saved: {path} (async: background write {self.manager.last_write_s:.2f} s, "
                   f"commit {(time.perf_counter() - t0) * 1000:.1f} ms)")
        return str(path)

    def ready(self) -> bool:
        """This rank's background write has finished (no collective)."""
        return self.manager.ready()

    # ------------------------------------------------------------------ loading
    def resume(self) -> Path | None:
        """Load the newest checkpoint that loads on every rank into the state objects.
        The per-rank state is checked (types, ranges, the step of its directory) on every
        rank and agreed on: a bad file on any rank is one error on all of them, never a
        hang of the others in the next collective."""
        loaded = self.manager.load_latest(self.shards.model, self.shards.optimizer)
        if loaded is None:
            self._info("no checkpoint found; starting from step 0")
            return None
        latest, extra = loaded
        err = None
        try:
            self._apply(latest, extra)
        except Exception as exc:  # noqa: BLE001 - any rank's failure is every rank's one line, never a hang
            name = self.manager.extra_path.name if self.manager.extra_path else "extra_rank*.pt"
            err = (f"{latest}: its per-rank state ({name}) is not what this program writes "
                   f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})")
        with tdist.collective("checkpoint load (agreeing on the per-rank state)"):
            failed = tdist.first_error(self.info, err)
            if failed is None:
                low, high = tdist.min_max(self.info, self.progress.step)
        if failed is not None:
            raise CheckpointError(failed)
        if low != high:
            raise CheckpointError(f"{latest}: the ranks' per-rank states disagree on the step ({low} to {high})")
        self._info(f"resumed from {latest} at step {self.progress.step}")
        return latest

    def _apply(self, latest: Path, extra) -> None:
        """Load ``extra`` into the state objects; the step must be the directory's."""
        if not isinstance(extra, dict):  # a file torch.load accepts (weights_only) but with other contents
            raise TypeError(f"a {type(extra).__name__}, not a dict")
        load_per_rank_state(self.per_rank, extra)
        if f"step_{self.progress.step:08d}" != latest.name:
            raise ValueError(f"step={self.progress.step} is not the step of its directory")
