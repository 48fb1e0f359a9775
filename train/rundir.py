"""The run directory (``--out``): one run at a time, and a record of what ran in it.

* :class:`RunLock` - an exclusive ``flock`` on ``OUT/.train.lock``, held by one process
  per run (rank 0) for the life of the run. The file holds host, pid, process start time
  and the torchrun run id; a second run into the same directory is refused with one line
  naming the holder. The kernel drops the lock when its holder dies, so a crashed run
  never blocks the next one on the same host. On file systems where ``flock`` is not
  coherent across hosts the file content decides: a lock written by another host is
  honoured (the message names it and the file to delete if that run is gone); one
  written on this host is stale only when its process is dead (pid and start time).
  A torchrun restart of the same job (same run id) takes its own lock over.
* :func:`prepare` - provenance. A fresh run refuses a directory that holds an earlier
  run's files unless ``--overwrite`` (which moves them aside into ``OUT/replaced-<UTC
  time>/``, never deletes); ``--resume`` refuses a config that differs from the recorded
  one in anything that changes the training unless ``--allow-config-change``; every
  start and resume is recorded at the top of ``config.yaml`` (as comments, so the file
  stays loadable with ``--config``).
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import socket
import stat
from pathlib import Path

import yaml

from core.errors import InputError
from core.runlayout import ASIDE_PREFIX, CONFIG_NAME, HISTORY_HEAD, LOCK_NAME, RUN_FILES
from core.safety import atomic_write, excerpt, excerpt_path, load_yaml_file, parse_json
from train.config import JobConfig
from train.errors import ConfigError, RunDirBusy

HISTORY_PREFIX = "# - "
# Keys that may change on --resume without changing what is trained.
RESUME_SAFE_KEYS = (
    "train.steps", "train.log_every", "train.timeout_s", "train.shutdown_grace_s", "train.device",
    "checkpoint.", "metrics.", "data.cache_dir",
)



def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _proc_start(pid: int) -> str | None:
    """Start time of ``pid`` in clock ticks since boot (Linux), to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return fields[19].decode()
    except (OSError, IndexError):
        return None


def _alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    current = _proc_start(pid)
    return start is None or current is None or current == start


def run_id() -> str | None:
    """torchrun's run id (``--rdzv-id``; the Slurm job id in our sbatch scripts). torchrun's
    default ``none`` (c10d without ``--rdzv-id``) is shared by unrelated jobs: no id."""
    value = os.environ.get("TORCHELASTIC_RUN_ID") or None
    return None if value == "none" else value


class RunLock:
    """Exclusive lock on a run directory (``OUT/.train.lock``), or with ``name`` on one
    output of a command (a bench report, a token file); use as a context manager.
    ``label`` names the output in messages (default ``--out OUT``)."""

    def __init__(self, out_dir: Path, name: str = LOCK_NAME, label: str | None = None):
        self.path = out_dir / name
        self.label = label or f"--out {excerpt_path(out_dir)}"
        self.fd: int | None = None

    def _holder(self) -> dict:
        try:
            raw = os.pread(self.fd, 4096, 0) if self.fd is not None else self.path.read_bytes()[:4096]
            data = parse_json(raw.decode("utf-8", "replace") or "{}")
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    @staticmethod
    def _describe(holder: dict) -> str:
        if not holder:
            return "another process (no holder recorded)"
        parts = [f"pid {holder.get('pid')} on {holder.get('host')}"]
        if holder.get("run_id"):
            parts.append(f"run id {holder['run_id']}")
        if holder.get("since"):
            parts.append(f"since {holder['since']}")
        return ", ".join(str(p) for p in parts)

    def acquire(self, retries: int = 3) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
        except OSError as exc:
            raise ConfigError(f"{self.label}: cannot create the run lock "
                              f"{self.path.name} ({exc.strerror})") from None
        self.fd = fd
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            self._close()
            raise ConfigError(f"{self.label}: {self.path.name} is not a regular file")
        if os.fstat(fd).st_nlink > 1 and retries > 0:
            # a hard link to another directory's lock (``cp -al`` of a run, maybe still running): locking
            # it would lock that run's file, writing it would rewrite it. Drop this name, take a new file.
            os.unlink(self.path)
            self._close()
            return self.acquire(retries - 1)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = self._holder()
            self._close()
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise RunDirBusy(f"{self.label}: in use by another run "
                                 f"({self._describe(holder)}); use another --out or wait for it") from None
            raise ConfigError(f"{self.label}: cannot lock {self.path.name} "
                              f"({exc.strerror})") from None
        try:  # the holder unlinks the file on release: make sure we locked the file at the path
            same = os.path.samestat(os.fstat(fd), os.stat(self.path, follow_symlinks=False))
        except OSError:
            same = False
        if not same:
            self._close()
            if retries > 0:
                return self.acquire(retries - 1)
            raise RunDirBusy(f"{self.label}: the run lock keeps changing hands")
        holder, host = self._holder(), socket.gethostname()
        if holder and not self._stale(holder, host):
            self._close()
            raise RunDirBusy(
                f"{self.label}: in use by another run ({self._describe(holder)}; "
                f"recorded in {self.path}, which this file system's locks cannot confirm); if that run is "
                "gone, delete the file"
            )
        me = {"host": host, "pid": os.getpid(), "start": _proc_start(os.getpid()), "run_id": run_id(),
              "since": _now()}
        payload = json.dumps(me).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, payload, 0)
        os.fsync(fd)

    @staticmethod
    def _stale(holder: dict, host: str) -> bool:
        if holder.get("run_id") and holder.get("run_id") == run_id():
            return True  # a torchrun restart of this very job
        if holder.get("host") != host:
            return False  # cannot check a process on another host: honour it
        pid = holder.get("pid")
        if not isinstance(pid, int) or pid == os.getpid():
            return True
        return not _alive(pid, holder.get("start"))

    def _close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.unlink(self.path)  # still holding the lock: nobody else can have taken it
        except OSError:
            pass
        self._close()

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


# --------------------------------------------------------------------------- moving aside


def lock_held(path: Path) -> bool:
    """A live process holds the lock file ``path`` (:class:`RunLock`)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def _live_lock_under(path: Path) -> Path | None:
    """A run lock below ``path`` that a live run holds (a run directory nested in what
    would be moved: moving it would pull the directory from under that run)."""
    if not path.is_dir() or path.is_symlink():
        return None
    for root, _, files in os.walk(path):
        for name in files:
            if (name == LOCK_NAME or (name.startswith(".") and name.endswith(".lock"))) \
                    and lock_held(Path(root) / name):
                return Path(root) / name
    return None


def move_aside(parent: Path, names: list[str], what: str) -> Path:
    """Move ``parent/NAME`` (each that exists) into a new ``parent/replaced-<UTC time>/``
    and return it: the one way an earlier result makes room (``train run --overwrite``,
    bench reports, compression variant runs); nothing is deleted. The directory is made
    with ``mkdir`` (never reused: a second move in the same second gets ``...-2``)."""
    present = [n for n in names if os.path.lexists(parent / n)]
    for name in present:
        busy = _live_lock_under(parent / name)
        if busy is not None:
            raise RunDirBusy(f"{what}: {excerpt_path(parent / name)} holds a live run ({excerpt_path(busy)}); "
                             "it cannot be moved aside while that run goes on")
    base = f"{ASIDE_PREFIX}{_now().replace(':', '')}"
    for i in range(1, 10_000):
        aside = parent / (base if i == 1 else f"{base}-{i}")
        try:
            aside.mkdir()
            break
        except FileExistsError:
            continue
    else:  # pragma: no cover - 10 000 moves in one second
        raise ConfigError(f"{what}: cannot find a free {base}-N directory")
    for name in present:
        os.replace(parent / name, aside / name)
    return aside


# --------------------------------------------------------------------------- provenance


def _flatten(data: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _safe_to_change(key: str) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in RESUME_SAFE_KEYS)


def config_changes(old: dict, new: dict) -> list[str]:
    """``key: old -> new`` for every training-relevant difference."""
    a, b = _flatten(old), _flatten(new)
    changes = []
    for key in sorted(set(a) | set(b)):
        if a.get(key, "<unset>") != b.get(key, "<unset>") and not _safe_to_change(key):
            changes.append(f"{key}: {excerpt(a.get(key, '<unset>'), 40)} -> {excerpt(b.get(key, '<unset>'), 40)}")
    return changes


def earlier_run_files(out_dir: Path) -> list[str]:
    found = []
    for name in RUN_FILES:
        path = out_dir / name
        if path.is_dir() and any(path.iterdir()):
            found.append(name + "/")
        elif path.exists() and not path.is_dir():
            found.append(name)
    return found


def _history(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return [ln for ln in text.splitlines() if ln.startswith(HISTORY_PREFIX)][-200:]


def write_config(out_dir: Path, job: JobConfig, event: str) -> None:
    """config.yaml = the run history (comments) + the config now in effect."""
    path = out_dir / CONFIG_NAME
    history = _history(path) + [f"{HISTORY_PREFIX}{_now()} {event} (host {socket.gethostname()}, pid {os.getpid()})"]
    text = f"{HISTORY_HEAD}, oldest first:\n" + "\n".join(history) + "\n"
    text += yaml.safe_dump(job.to_dict(), sort_keys=False)
    atomic_write(path, text, what="--out config.yaml")


def planned_keys(job: JobConfig) -> frozenset[str]:
    """The plan's keys this job leaves open: a resumed run takes the recorded values for them
    (``train.plan_apply``), so a difference there is no change of what is trained."""
    from train.plan import PLAN_KEYS

    explicit = getattr(job, "explicit_keys", None)
    return frozenset() if explicit is None else frozenset(PLAN_KEYS) - explicit


def check_layout(out_dir: Path) -> None:
    """The run's own entries, where they exist, have their kind and are its own:
    config.yaml and metrics.jsonl regular files; checkpoints/, flight_recorder/, tb/,
    traces/ and wandb/ real directories - never symbolic links: through one, two runs
    would load, write and (retention) delete in one directory that only one of them has
    locked; checkpoints/latest a regular file (it is replaced at every save). Otherwise a
    resumed run would fail only at its first save, or share another run's files."""
    shown = excerpt_path(out_dir)
    for name in (*RUN_FILES, "checkpoints/latest"):
        path = out_dir / name
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise ConfigError(f"--out {shown}: {name} cannot be checked ({exc.strerror})") from None
        if stat.S_ISLNK(mode):
            raise ConfigError(
                f"--out {shown}: {name} is a symbolic link (to {excerpt(os.readlink(path))}); a run's own files "
                "must lie inside its --out, or two runs could share them: replace the link with what it points "
                "to, or use a new --out")
        want_dir = name not in (CONFIG_NAME, "metrics.jsonl", "checkpoints/latest")
        if not (stat.S_ISDIR(mode) if want_dir else stat.S_ISREG(mode)):
            kind = "a directory" if want_dir else "a regular file"
            raise ConfigError(f"--out {shown}: {name} is not {kind}; move it away or use a new --out")


def prepare(out_dir: Path, job: JobConfig, resuming: bool, overwrite: bool, allow_config_change: bool,
            log) -> str:
    """Rank 0, under the run lock, before training: refuse, or return the event that
    :func:`write_config` records once training has really started (a run that fails
    before, e.g. on a bad data file, leaves config.yaml as it was)."""
    earlier = earlier_run_files(out_dir)
    shown = excerpt_path(out_dir)
    if not resuming:
        if earlier and not overwrite:
            raise ConfigError(
                f"--out {shown}: holds an earlier run ({', '.join(earlier)}); pass --resume to continue it, "
                "--overwrite to move it aside and start fresh, or use a new --out"
            )
        if earlier:
            aside = move_aside(out_dir, [name.rstrip("/") for name in earlier], f"--out {shown}")
            log(f"--overwrite: moved the earlier run ({', '.join(earlier)}) to {aside}")
        check_layout(out_dir)  # what is left: an empty checkpoints/ that is a link, ...
        return f"fresh start (--overwrite: the earlier run is in {aside.name}/)" if earlier else "fresh start"
    check_layout(out_dir)
    path = out_dir / CONFIG_NAME
    if not path.exists():
        return "resume (no earlier config.yaml)"
    try:
        old = load_yaml_file(path, "--out config.yaml")
        if not isinstance(old, dict):
            raise InputError(f"{path}: not a mapping")
    except InputError as exc:
        if not allow_config_change:
            raise ConfigError(f"--resume: cannot compare with the recorded {path} ({exc}); pass "
                              "--allow-config-change to resume anyway") from None
        old = {}
    new = yaml.safe_load(yaml.safe_dump(job.to_dict(), sort_keys=False))
    changes = [c for c in config_changes(old, new) if c.split(":", 1)[0] not in planned_keys(job)]
    if changes and not allow_config_change:
        more = f" (and {len(changes) - 3} more)" if len(changes) > 3 else ""
        raise ConfigError(
            f"--resume: the config differs from the run in {shown} in what it trains: "
            f"{'; '.join(changes[:3])}{more}; pass --allow-config-change to resume with it anyway"
        )
    return f"resume with changes: {'; '.join(changes)}" if changes else "resume (config unchanged)"
