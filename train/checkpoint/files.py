"""Checkpoint files on disk: verification against the manifest, and one-line failure causes.

Used by :mod:`train.checkpoint` (saving, loading, retention) and by the tests and scripts
that check what a run left behind.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path

from core.errors import InputError
from core.safety import excerpt, file_kind, parse_json
from train.checkpoint import safe_load

_STEP = r"step_(\d{8})"
STEP_RE = re.compile(rf"^{_STEP}$")
STEP_SUFFIX_RE = re.compile(rf"{_STEP}$")  # also the temporary directory of a save (.tmp-step_N)
MAX_MANIFEST_BYTES = 16 << 20  # a manifest lists two files per rank: far below this
MAX_NAME_BYTES = 255


def _file_name(name: object) -> bool:
    """A plain file name of the checkpoint directory (no path, no NUL, not too long)."""
    return (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name
            and len(name.encode("utf-8", "surrogateescape")) <= MAX_NAME_BYTES)


def _size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62


def _manifest(ckpt: Path) -> tuple[dict | None, str | None]:
    """(manifest, None) or (None, why it cannot be used). Every OS error (a name too long, no
    permission, a FIFO in its place) is a reason, never an exception."""
    path = ckpt / "manifest.json"
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return None, "no manifest.json (incomplete save)"
    except OSError as exc:
        return None, f"manifest.json cannot be read ({exc.strerror})"
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_MANIFEST_BYTES:
        return None, "manifest.json is not a regular file of a manifest's size"
    try:
        manifest = parse_json(path.read_bytes())
    except OSError as exc:
        return None, f"manifest.json cannot be read ({exc.strerror})"
    except ValueError:  # not JSON, not UTF-8
        return None, "manifest.json is unreadable"
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(_file_name(k) and _size(v) for k, v in files.items()):
        return None, "manifest.json is unreadable (its files must map plain file names to byte counts)"
    return manifest, None


def verify(ckpt: Path) -> str | None:
    """None when ``ckpt`` is complete, else the reason it is not: its manifest (written last)
    lists ``.metadata`` and ``extra_rank0.pt``, names its own step, and every file it lists is
    a regular file of the recorded size."""
    manifest, reason = _manifest(ckpt)
    if manifest is None:
        return reason
    sizes = manifest["files"]
    for required in (".metadata", "extra_rank0.pt"):
        if required not in sizes:
            return f"manifest.json does not list {required}"
    named = STEP_SUFFIX_RE.search(ckpt.name)
    step = manifest.get("step")
    if named and not (_size(step) and step == int(named.group(1))):
        shown = repr(step)[:40] if isinstance(step, (int, float)) else excerpt(step)
        return f"manifest.json records step {shown}, not the directory's {int(named.group(1))}"
    for name, size in sizes.items():
        try:
            st = os.stat(ckpt / name, follow_symlinks=False)
        except FileNotFoundError:
            return f"{name} is missing"
        except OSError as exc:
            return f"{excerpt(name)} cannot be checked ({exc.strerror})"
        if not stat.S_ISREG(st.st_mode):
            return f"{excerpt(name)} is not a regular file"
        if st.st_size != size:
            return f"{name} has {st.st_size} bytes, manifest says {size}"
    return None


def read_pointer(root: Path) -> tuple[str | None, str | None]:
    """The step directory ``root/latest`` names: (name, None); (None, None) when there is no
    pointer; (None, why) when it is no regular file or names no step directory. Never reads
    more than a name's length, never follows a link (a link to /dev/zero is reported)."""
    path = root / "latest"
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return None, f"is {'a symbolic link' if stat.S_ISLNK(st.st_mode) else file_kind(st.st_mode)}, not a file"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            raw = os.read(fd, 64)
        finally:
            os.close(fd)
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror})"
    named = raw.decode("utf-8", "replace").strip()
    if not STEP_RE.match(named):
        return None, f"names {excerpt(named)}, which is no step directory name"
    return named, None


def unreadable_metadata(ckpt: Path) -> str | None:
    try:
        safe_load.load_metadata(ckpt / safe_load.METADATA_FILE)
    except safe_load.UnsafeCheckpoint as exc:  # named: never loaded, whatever else is wrong with it
        return f".metadata {str(exc).split(': ', 1)[-1]}"
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
    if isinstance(exc, InputError):  # a target refused by core.safety (a link or a FIFO at `latest`)
        text = str(exc)
    elif isinstance(exc, OSError) and exc.errno:
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
