"""Checkpoint files on disk: verification against the manifest, and one-line failure causes.

Used by :mod:`train.checkpoint` (saving, loading, retention) and by the tests and scripts
that check what a run left behind.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch.distributed.checkpoint as dcp

from launch.safety import parse_json


def verify(ckpt: Path) -> str | None:
    """None when ``ckpt`` is complete, else the reason it is not."""
    manifest_path = ckpt / "manifest.json"
    if not manifest_path.is_file():
        return "no manifest.json (incomplete save)"
    try:
        manifest = parse_json(manifest_path.read_text())
        files = dict(manifest["files"])
        sizes = {str(k): int(v) for k, v in files.items()}
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        return "manifest.json is unreadable"
    for required in (".metadata", "extra_rank0.pt"):
        if required not in sizes:
            return f"manifest.json does not list {required}"
    for name, size in sizes.items():
        f = ckpt / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != size:
            return f"{name} has {f.stat().st_size} bytes, manifest says {size}"
    return None


def unreadable_metadata(ckpt: Path) -> str | None:
    try:
        dcp.FileSystemReader(str(ckpt)).read_metadata()
    except Exception as exc:  # noqa: BLE001 - any reason means unreadable
        return f".metadata is unreadable ({type(exc).__name__})"
    return None


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def timed_out(exc: BaseException, info) -> bool:
    """A collective timeout propagates to the loop (it names the op and rank there)."""
    return info.backend is not None and "timed out" in str(exc).lower()


def describe_failure(exc: BaseException, rank: int, disk: Path | None = None) -> str:
    """``rank R: <cause>`` on one line; DCP's CheckpointException is unwrapped to the
    first failing rank's own exception (it would otherwise carry a traceback). For a
    save (``disk`` given) whose cause is not an OS error with an errno - torch's zip
    writer turns ENOSPC/EFBIG into "unexpected pos" - the free space is appended."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        first = min(failures)
        inner = failures[first]
        inner = inner[0] if isinstance(inner, tuple) else inner
        if isinstance(inner, BaseException):
            return describe_failure(inner, first, disk)
    if isinstance(exc, OSError) and exc.errno:
        what = f"{os.strerror(exc.errno)} (errno {exc.errno})"
        where = f": {exc.filename}" if exc.filename else ""
        text = f"{what}{where}"
    else:
        text = f"{type(exc).__name__}: {exc}"
        if "unexpected pos" in text:  # torch's zip writer (torch.save) on a failed write
            text = "No space left on device or file too large (torch.save: 'unexpected pos')"
        if disk is not None:
            try:
                free = shutil.disk_usage(disk).free / 2**20
            except OSError:
                free = None
            if free is not None and free < 1 and "unexpected pos" in text:  # the zip writer's failed write
                text = f"No space left on device (torch's writer: unexpected pos; free space on {disk}: {free:.1f} MiB)"
            elif free is not None:
                text += f" (free space on {disk}: {free:.1f} MiB)"
    text = " ".join(text.split())
    if len(text) > 400:
        text = text[:397] + "..."
    return f"rank {rank}: {text}"
