"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP).

Layout under ``OUT/checkpoints``::

    step_00000200/            a complete checkpoint
        .metadata, __*_*.distcp   DCP: model + optimizer, every rank writes its shards
        extra_rank{r}.pt          per-rank state: step, scheduler, RNG, data position,
                                  compression residuals
        manifest.json             written last: step, world size, every file and its size
    latest                        name of the newest complete checkpoint (updated last)

Saving: everything is written under ``.tmp-step_N`` and renamed when every rank has
finished, so a crash mid-save never leaves a half checkpoint under a real name. A save
that fails on any rank (disk full, quota, I/O error) fails on every rank with one
error naming the rank and the cause; the partial directory is removed and the previous
checkpoint stays the latest. After a successful save, the newest ``keep`` complete
checkpoints stay; older ones, ``.tmp-*`` left by crashed saves and step directories
that fail verification and are older than the newest complete checkpoint are removed.

Loading: rank 0 lists the step directories, verifies each against its manifest (every
file present with its recorded size) and skips bad ones with a warning naming them;
every rank then tries them newest first and falls back to the previous one, together,
when one cannot be loaded. If none loads, or every step directory fails verification,
that is an error: the job never silently starts from scratch next to checkpoints it could
not read (and so never lets retention delete them).

Nothing read back runs code from the files: DCP's ``.metadata`` pickle goes through an
allow-list unpickler and DCP's non-tensor entries through ``torch.load(weights_only=True)``
(:mod:`train.checkpoint.safe_load`); per-rank state is read with ``torch.load(weights_only=True)``: it
holds tensors and plain Python containers only (the numpy RNG state is stored as a tensor). State registered in ``extra_state`` by other
components must follow that rule.

This module is the storage: what is in a checkpoint is assembled by the ``Stateful``
objects of :mod:`train.checkpoint.state`, and when to save by :class:`train.checkpoint.checkpointer.Checkpointer`.
"""

from __future__ import annotations

import datetime
import inspect
import io
import json
import logging
import os
import shutil
import time
import warnings
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

try:  # torch >= 2.9: reusable (pinned) staging buffers for async_save
    from torch.distributed.checkpoint.staging import DefaultStager as _DefaultStager
    from torch.distributed.checkpoint.staging import StagingOptions as _StagingOptions
except ImportError:  # older torch: async_save stages into fresh host memory each time
    _DefaultStager = _StagingOptions = None

from core.safety import (
    atomic_write,  # the one writer: temp + fsync + rename, regular files only
    check_output_target,
    parse_json,
)
from train import distributed as tdist
from train.checkpoint import safe_load
from train.checkpoint.files import (
    STEP_RE,
    describe_failure,
    fsync_dir,
    read_pointer,
    timed_out,
    unreadable_metadata,
    verify,
)
from train.checkpoint.state import ModelOptimizer
from train.errors import CheckpointError, CheckpointModelMismatch

_ASYNC_SAVE_PARAMS = set(inspect.signature(dcp.async_save).parameters)
# DCP warns at every save and load of a run without a process group (one process) that it
# "assumes the intent is to save in a single process", also with no_dist=True and also from
# async_save's writer thread: that is the intent here. Only that message is dropped.
warnings.filterwarnings("ignore", message=r"torch\.distributed is (disabled|unavailable)", category=UserWarning)
log = logging.getLogger(__name__)

TMP_PREFIX = ".tmp-"


def _stager_reusable(stager) -> bool:
    """False once a stager's inner StateDictStager has been closed (its copy dispatch table
    emptied): torch 2.11 does that at the end of every stage (pytorch#183413)."""
    inner = getattr(stager, "_state_dict_stager", None)
    return inner is None or bool(getattr(inner, "_deepcopy_dispatch", True))



@dataclass
class _Pending:
    """An async save whose background write has not been committed yet."""

    step: int
    tmp: Path
    final: Path
    previous: Path | None
    future: Future
    started: float


def _kept(previous: Path | None) -> str:
    return f"{previous} is still the latest complete checkpoint" if previous else "no earlier checkpoint exists"


def _warn(msg: str) -> None:
    log.warning("%s", msg)


# ----------------------------------------------------------------------------- verification


def model_mismatch(metadata, model_sd: dict[str, Any]) -> str | None:
    """How the model tensors recorded in a checkpoint's DCP ``metadata`` differ from ``model_sd``
    (the model's state dict as saved: ``get_state_dict`` names, global shapes), or None. Names
    are DCP's flattened ``model.`` keys."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    saved = {k: m for k, m in metadata.state_dict_metadata.items()
             if k.startswith("model.") and isinstance(m, TensorStorageMetadata)}
    current = {f"model.{k}": v for k, v in model_sd.items() if isinstance(v, torch.Tensor)}
    for key, tensor in current.items():
        if key not in saved:
            return f"it has no {key}"
        if tuple(saved[key].size) != tuple(tensor.shape):
            return f"{key} is {list(saved[key].size)} there, {list(tensor.shape)} here"
    extra = sorted(set(saved) - set(current))
    if extra:
        return f"it has {extra[0]}{f' and {len(extra) - 1} more tensors' if len(extra) > 1 else ''}, which this model has not"
    return None


class CheckpointManager:
    def __init__(self, root: Path, info: tdist.DistInfo, keep: int, async_save: bool = False,
                 timeout_s: float = 600):
        self.root = root
        self.info = info
        self.rank = info.rank
        self.world_size = info.world_size
        self.keep = keep
        self.async_save = async_save
        self.info_timeout_s = timeout_s
        self.last_stall_s = 0.0  # how long the last save() blocked the caller
        self.last_write_s = 0.0  # async: staging to commit of the last background write
        self._pending: _Pending | None = None
        self.rejected: list[tuple[str, str]] = []  # step dirs that failed verification (candidates)
        self.pointer: str | None = None  # what the latest pointer names (candidates)
        self.extra_path: Path | None = None  # the per-rank file the last load read
        self._stager = None
        self._async_group = None
        if async_save and info.backend is not None:
            # DCP's background thread runs its own collectives (plan gather, metadata): on
            # a gloo group of their own they never interleave with the training loop's.
            self._async_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))

    # ------------------------------------------------------------------ listing
    def _step_dirs(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return sorted((p for p in self.root.iterdir() if STEP_RE.match(p.name) and p.is_dir()), reverse=True)

    def complete_checkpoints(self, warn: bool = True, rejected: list | None = None) -> list[Path]:
        """Complete checkpoints on this rank's view of the disk, newest first;
        incomplete ones are skipped (with a warning naming them when ``warn``), and listed
        as ``(name, reason)`` in ``rejected`` when given."""
        out = []
        for p in self._step_dirs():
            reason = verify(p)
            if reason:
                if warn:
                    _warn(f"skipping {p}: {reason}")
                if rejected is not None:
                    rejected.append((p.name, reason))
                continue
            out.append(p)
        return out

    def latest_local(self) -> Path | None:
        """Newest complete checkpoint, no collectives, no warnings (for messages)."""
        found = self.complete_checkpoints(warn=False)
        return found[0] if found else None

    def candidates(self) -> list[Path]:
        """Complete checkpoints, newest first, as rank 0 sees them (one decision for all
        ranks). A stale or dangling ``latest`` pointer is reported, never followed: the
        rename of a verified directory is the commit point. The step directories that
        failed verification are in :attr:`rejected` afterwards (on every rank)."""
        decision = None
        if self.rank == 0:
            rejected: list[tuple[str, str]] = []
            found = self.complete_checkpoints(warn=True, rejected=rejected)
            decision = ([p.name for p in found], rejected, self._check_pointer(found))
        with tdist.collective("broadcast (checkpoint choice from rank 0)"):
            names, self.rejected, self.pointer = tdist.broadcast_object(self.info, decision)
        return [self.root / n for n in names]

    def _check_pointer(self, found: list[Path]) -> str | None:
        """Warn where ``latest`` is unreadable or names another directory than the newest complete
        checkpoint; returns what it names."""
        named, problem = read_pointer(self.root)
        newest = found[0].name if found else "none"
        if problem:
            _warn(f"{self.root / 'latest'} {problem}; using the newest complete checkpoint ({newest})")
        if named is None or (found and named == found[0].name):
            return named
        if not os.path.lexists(self.root / named):
            why = "which does not exist"
        elif named in {p.name for p in found}:
            why = "which is older than the newest complete checkpoint (its save finished after the pointer)"
        else:
            why = "which is not a complete checkpoint"
        _warn(f"'latest' names {named!r}, {why}; using the newest complete one ({newest})")
        return named

    def unusable(self) -> str:
        """The step directories that failed verification at the last :meth:`candidates`, for
        an error message (empty when none did)."""
        shown = "; ".join(f"{name}: {why}" for name, why in self.rejected[:3])
        more = f"; and {len(self.rejected) - 3} more" if len(self.rejected) > 3 else ""
        return shown + more

    def latest(self) -> Path | None:
        found = self.candidates()
        return found[0] if found else None

    # ------------------------------------------------------------------ saving
    def save(self, step: int, model, optimizer, extra: dict[str, Any], wait: bool = True) -> Path:
        """Write checkpoint ``step``; on any rank's failure raise :class:`CheckpointError`
        on every rank, having removed the partial directory. A save still in flight is
        finished (committed) first: at most one is ever in flight.

        With ``async_save`` the state is staged to host memory (pinned on CUDA) and DCP
        writes it from a background thread; ``wait=False`` returns right after staging
        and :meth:`finish` commits it later (the trainer polls :meth:`ready`). The commit
        is the same as a synchronous save's, so ``latest`` only moves after the write
        completed on every rank and the directory verified."""
        if self._pending is not None:
            self.finish()
        final = self.root / f"step_{step:08d}"
        tmp = self.root / f"{TMP_PREFIX}{final.name}"
        previous = self.latest_local()
        t0 = time.perf_counter()

        def prepare() -> None:
            if self.rank == 0:
                self.root.mkdir(parents=True, exist_ok=True)
                check_output_target(self.root / "latest", "checkpoint")  # refused now, not after the commit
                if tmp.exists():
                    shutil.rmtree(tmp)
                tmp.mkdir()

        def write_extra() -> None:
            buf = io.BytesIO()  # serialised in memory: a full disk is then a plain OSError (ENOSPC)
            torch.save(extra, buf)
            atomic_write(tmp / f"extra_rank{self.rank}.pt", buf.getvalue(), what="checkpoint")

        def write_shards() -> None:
            state = ModelOptimizer(model, optimizer).state_dict()
            if self.async_save:
                stager = self._get_stager()
                kwargs = {"async_stager": stager} if stager is not None else {}
                future = dcp.async_save(state, checkpoint_id=str(tmp), process_group=self._async_group, **kwargs)
                self._pending = _Pending(step, tmp, final, previous, future, time.perf_counter())
            else:
                with tdist.collective("checkpoint save (DCP gather/scatter)"):
                    dcp.save(state, checkpoint_id=str(tmp))
            write_extra()

        with tdist.collective("checkpoint save (barrier)"):
            self._attempt(prepare, step, tmp, previous)
            self._attempt(write_shards, step, tmp, previous)
        self.last_stall_s = time.perf_counter() - t0
        if self._pending is None:
            self._commit(step, tmp, final, previous)
        elif wait:
            self.finish()
            self.last_stall_s = time.perf_counter() - t0
        return final

    def ready(self) -> bool:
        """This rank's background write has finished (successfully or not); no collective."""
        return self._pending is not None and self._pending.future.done()

    @property
    def in_flight(self) -> int | None:
        """Step of the save in flight, if any."""
        return self._pending.step if self._pending is not None else None

    def finish(self) -> Path | None:
        """Wait for the save in flight (if any) on every rank, verify and commit it.
        Collective: every rank calls it at the same point."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        err = None
        with tdist.collective("checkpoint save (waiting for the background write)"):
            try:
                pending.future.result()
            except (Exception, dcp.CheckpointException) as exc:  # noqa: BLE001 - decided together below
                if timed_out(exc, self.info):
                    raise
                err = describe_failure(exc, self.rank, self.root)
            failed = tdist.first_error(self.info, err)
        if failed is not None:
            if self.rank == 0:
                shutil.rmtree(pending.tmp, ignore_errors=True)
            raise CheckpointError(f"checkpoint save at step {pending.step} failed on {failed}; "
                                  + _kept(pending.previous))
        self.last_write_s = time.perf_counter() - pending.started
        self._commit(pending.step, pending.tmp, pending.final, pending.previous)
        return pending.final

    def _commit(self, step: int, tmp: Path, final: Path, previous: Path | None) -> None:
        def commit() -> None:
            if self.rank != 0:
                return
            files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
            manifest = {"step": step, "world_size": self.world_size, "files": files}
            atomic_write(tmp / "manifest.json", json.dumps(manifest, indent=1), what="checkpoint")
            reason = verify(tmp) or unreadable_metadata(tmp)
            if reason:
                raise CheckpointError(f"{tmp} does not verify after writing: {reason}")
            fsync_dir(tmp)
            if final.exists():  # same step saved again (e.g. resumed run): replace it
                shutil.rmtree(final)
            os.replace(tmp, final)
            fsync_dir(self.root)
            atomic_write(self.root / "latest", final.name + "\n", what="checkpoint")

        with tdist.collective("checkpoint save (barrier)"):
            self._attempt(commit, step, tmp, previous)
        if self.rank == 0:
            self._retain()

    def _attempt(self, fn, step: int, tmp: Path, previous: Path | None) -> None:
        """Run ``fn`` on every rank; if it failed anywhere, fail everywhere with one error."""
        err = None
        try:
            fn()
        except (Exception, dcp.CheckpointException) as exc:  # DCP's is a BaseException
            if timed_out(exc, self.info):
                raise
            err = describe_failure(exc, self.rank, self.root)
        failed = tdist.first_error(self.info, err)
        if failed is not None:
            if self._pending is not None and self._pending.tmp == tmp:
                self._drop_pending()
            if self.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(f"checkpoint save at step {step} failed on {failed}; {_kept(previous)}")

    def _drop_pending(self) -> None:
        """Forget the save in flight after a failure elsewhere (its thread ends on its own)."""
        pending, self._pending = self._pending, None
        try:
            pending.future.result(timeout=self.info_timeout_s)
        except BaseException:  # noqa: BLE001 - the save already failed; only waiting for the thread
            pass

    def _get_stager(self):
        """One stager for the whole run: its host buffers (pinned when CUDA is used) are
        reused by every save instead of being allocated and pinned each time.

        torch 2.11's ``DefaultStager`` closes its own deep-copy machinery after every stage, so
        a reused one fails the next save with ``KeyError: <class 'type'>`` (pytorch#183413;
        seen on 2xH200 at the second async save). A stager found closed is replaced."""
        if self._stager is not None and not _stager_reusable(self._stager):
            self._stager = None  # already closed by torch itself; its staged copies stay with their writes
        if self._stager is None and _DefaultStager is not None and "async_stager" in _ASYNC_SAVE_PARAMS:
            cuda = torch.cuda.is_available() and self.info.device.type == "cuda"
            try:
                self._stager = _DefaultStager(_StagingOptions(
                    use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=False,
                    use_non_blocking_copy=cuda))
            except TypeError as exc:  # a torch whose StagingOptions differ: async_save's own staging
                _warn(f"DCP DefaultStager unavailable ({exc}); async_save stages into fresh host memory")
                self._stager = None
        return self._stager

    def abandon(self) -> None:
        """Teardown after an error or at exit: let a write in flight end (it is never
        committed: its ``.tmp-`` directory is cleaned up by a later save), then free the
        staging buffers. No collectives."""
        if self._pending is not None:
            self._drop_pending()
        if self._stager is not None:
            self._stager.close()
            self._stager = None

    def _retain(self) -> None:
        """Keep the newest ``keep`` complete checkpoints; remove older ones, leftovers of
        crashed saves (``.tmp-*``) and step directories that fail verification - but only
        those older than the newest complete checkpoint: a directory that fails verification
        with no newer complete one is never deleted (it may be all that is left of a run)."""
        for p in self.root.iterdir():
            if p.name.startswith(TMP_PREFIX) and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
        if not self.keep:
            return
        complete = self.complete_checkpoints(warn=False)
        if not complete:
            return
        kept, newest = set(complete[: self.keep]), complete[0].name
        for p in self._step_dirs():
            if p not in kept and p.name < newest:
                shutil.rmtree(p, ignore_errors=True)

    # ------------------------------------------------------------------ loading
    def load(self, ckpt: Path, model, optimizer) -> dict[str, Any]:
        """Load model/optimizer (resharding as needed) and return this rank's extra state."""
        try:  # fail here with one clear line rather than in DCP, which logs tracebacks first
            metadata = safe_load.load_metadata(ckpt / safe_load.METADATA_FILE)
        except safe_load.UnsafeCheckpoint:
            raise
        except Exception as exc:  # noqa: BLE001 - any reason means unreadable
            raise CheckpointError(f"{ckpt / '.metadata'} is unreadable ({type(exc).__name__}: {exc})") from None
        shards = ModelOptimizer(model, optimizer)
        state = shards.state_dict()
        mismatch = model_mismatch(metadata, state["model"])
        if mismatch:
            raise CheckpointModelMismatch(
                f"--resume: {ckpt} holds another model than this run's ({mismatch}): a model.* setting differs "
                "from the one it was saved with; nothing was changed: resume with that model, or use a new --out")
        with tdist.collective("checkpoint load (DCP)"):
            safe_load.load(state, ckpt)
        shards.load_state_dict(state)
        own = ckpt / f"extra_rank{self.rank}.pt"
        path = own if own.is_file() else ckpt / "extra_rank0.pt"
        if path != own:
            _warn(f"{ckpt} was saved by {self._saved_world(ckpt)} ranks; rank {self.rank} takes rank 0's step/scheduler state")
        self.extra_path = path  # named in errors about its contents
        return torch.load(path, map_location="cpu", weights_only=True)

    def load_latest(self, model, optimizer) -> tuple[Path, dict[str, Any]] | None:
        """Load the newest checkpoint that loads on every rank, falling back to older
        ones with a warning naming each one skipped. None when there is no step directory
        at all; :class:`CheckpointError` when there are some but none loads."""
        found = self.candidates()
        first = None
        for i, ckpt in enumerate(found):
            err = None
            try:
                extra = self.load(ckpt, model, optimizer)
            except CheckpointModelMismatch:  # the same on every rank; an older checkpoint would hide it
                raise
            except (Exception, dcp.CheckpointException) as exc:  # decided together below
                if timed_out(exc, self.info):
                    raise
                err = describe_failure(exc, self.rank)
            failed = tdist.first_error(self.info, err)
            if failed is None:
                return ckpt, extra
            first = first or f"{ckpt}: {failed}"
            if self.rank == 0:
                then = "; falling back to the previous checkpoint" if i + 1 < len(found) else ""
                _warn(f"skipping {ckpt}: cannot be loaded ({failed}){then}")
        if found:
            raise CheckpointError(f"none of the {len(found)} complete checkpoint(s) in {self.root} could be loaded "
                                  f"(newest: {first})")
        if self.rejected:  # never a silent fresh start next to checkpoints that exist but fail verification
            raise CheckpointError(f"{self.root}: no complete checkpoint to resume from; {len(self.rejected)} step "
                                  f"director{'y fails' if len(self.rejected) == 1 else 'ies fail'} verification "
                                  f"({self.unusable()}); nothing was changed: repair them, or move them away "
                                  "to start from scratch")
        if self.pointer:  # a checkpoint was committed here once and is gone: never a silent fresh start
            raise CheckpointError(f"{self.root / 'latest'} names {self.pointer!r}, but no complete checkpoint is in "
                                  f"{self.root} (removed?); nothing was changed: restore them, or remove "
                                  f"{self.root / 'latest'} to start from scratch")
        return None

    @staticmethod
    def _saved_world(ckpt: Path) -> int:
        return parse_json((ckpt / "manifest.json").read_text())["world_size"]
