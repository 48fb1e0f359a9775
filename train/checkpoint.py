"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP).

Layout under ``OUT/checkpoints``::

    step_00000200/            a complete checkpoint
        .metadata, __*_*.distcp   DCP: model + optimizer, every rank writes its shards
        extra_rank{r}.pt          per-rank state: step, scheduler, RNG, data position,
                                  compression residuals
        manifest.json             written last: step, world size, every file and its size
    latest                        name of the newest complete checkpoint (updated last)

A checkpoint is written under ``.tmp-step_N`` and renamed when every rank has finished,
so a crash mid-save never leaves a half checkpoint under a real name. Loading verifies
the manifest (every file present with its recorded size) and falls back to the previous
complete checkpoint with a warning naming the bad one.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

STEP_RE = re.compile(r"^step_(\d{8})$")


class CheckpointError(RuntimeError):
    pass


def _warn(msg: str) -> None:
    print(f"[checkpoint] warning: {msg}", file=sys.stderr, flush=True)


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _fsync_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def verify(ckpt: Path) -> str | None:
    """None when ``ckpt`` is complete, else the reason it is not."""
    manifest_path = ckpt / "manifest.json"
    if not manifest_path.is_file():
        return "no manifest.json (incomplete save)"
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
    except (ValueError, KeyError):
        return "manifest.json is unreadable"
    for name, size in files.items():
        f = ckpt / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != size:
            return f"{name} has {f.stat().st_size} bytes, manifest says {size}"
    return None


class CheckpointManager:
    def __init__(self, root: Path, rank: int, world_size: int, keep: int, barrier):
        self.root = root
        self.rank = rank
        self.world_size = world_size
        self.keep = keep
        self.barrier = barrier

    # ------------------------------------------------------------------ listing
    def complete_checkpoints(self) -> list[Path]:
        """Complete checkpoints, newest first; incomplete ones are skipped with a warning."""
        if not self.root.is_dir():
            return []
        out = []
        for p in sorted(self.root.iterdir(), reverse=True):
            if not STEP_RE.match(p.name) or not p.is_dir():
                continue
            reason = verify(p)
            if reason:
                _warn(f"skipping {p}: {reason}")
                continue
            out.append(p)
        return out

    def latest(self) -> Path | None:
        pointer = self.root / "latest"
        candidates = self.complete_checkpoints()
        if pointer.is_file():
            name = pointer.read_text().strip()
            named = [c for c in candidates if c.name == name]
            if named:
                return named[0]
            _warn(f"'latest' names {name!r}, which is not a complete checkpoint; using the newest complete one")
        return candidates[0] if candidates else None

    # ------------------------------------------------------------------ saving
    def save(self, step: int, model, optimizer, extra: dict[str, Any]) -> Path:
        final = self.root / f"step_{step:08d}"
        tmp = self.root / f".tmp-step_{step:08d}"
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir()
        self.barrier()
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
        extra_path = tmp / f"extra_rank{self.rank}.pt"
        with open(extra_path, "wb") as fh:
            torch.save(extra, fh)
            fh.flush()
            os.fsync(fh.fileno())
        self.barrier()
        if self.rank == 0:
            files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
            manifest = {"step": step, "world_size": self.world_size, "files": files}
            _fsync_write(tmp / "manifest.json", json.dumps(manifest, indent=1))
            if final.exists():  # same step saved again (e.g. resumed run): replace it
                shutil.rmtree(final)
            os.replace(tmp, final)
            _fsync_write(self.root / "latest", final.name + "\n")
            self._retain()
        self.barrier()
        return final

    def _retain(self) -> None:
        if not self.keep:
            return
        complete = [p for p in sorted(self.root.iterdir(), reverse=True) if STEP_RE.match(p.name)]
        for old in complete[self.keep:]:
            shutil.rmtree(old, ignore_errors=True)

    # ------------------------------------------------------------------ loading
    def load(self, ckpt: Path, model, optimizer) -> dict[str, Any]:
        """Load model/optimizer (resharding as needed) and return this rank's extra state."""
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(ckpt))
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
            options=StateDictOptions(strict=True),
        )
        own = ckpt / f"extra_rank{self.rank}.pt"
        path = own if own.is_file() else ckpt / "extra_rank0.pt"
        if path != own:
            _warn(f"{ckpt} was saved by {self._saved_world(ckpt)} ranks; rank {self.rank} takes rank 0's step/scheduler state")
        return torch.load(path, map_location="cpu", weights_only=False)

    @staticmethod
    def _saved_world(ckpt: Path) -> int:
        return json.loads((ckpt / "manifest.json").read_text())["world_size"]
