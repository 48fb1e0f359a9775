"""Process-group setup from torchrun's environment (or a single process without it), and
the failure paths of collectives: timeouts and dead peers.

* ``init_distributed`` bounds every collective by ``timeout_s``: a rank that stops
  answering ends the job with an error instead of a hang.
* ``collective(op)`` names what the loop is waiting for; ``collective_failure`` turns
  the backend's exception (gloo: "Timed out waiting 5000ms for recv operation",
  "Connection closed by peer") into one line naming that operation, this rank and the
  step. On NCCL the watchdog (``TORCH_NCCL_ASYNC_ERROR_HANDLING=3``) ends the process
  itself and logs the op type and sequence number; with the flight recorder enabled
  (``TORCH_FR_BUFFER_SIZE``) it also dumps the last collectives of every rank.

* ``shutdown(ok)`` / ``group_teardown()`` end a process's use of the group without hanging,
  and ``end_process(code)`` (called by the ``train`` command line) ends a process that used
  one without interpreter finalization: see "teardown" below.

SIGTERM/SIGINT handling (graceful stop) lives in :mod:`train.preemption`.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import logging
import os
import re
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist

from train.errors import CollectiveError, ConfigError

log = logging.getLogger(__name__)


@dataclass
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str | None  # None when running as one process without a process group

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def pick_device(requested: str, local_rank: int) -> torch.device:
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("train.device=cuda but no CUDA GPU is visible (check CUDA_VISIBLE_DEVICES and the driver)")
    if local_rank >= torch.cuda.device_count():
        raise RuntimeError(
            f"LOCAL_RANK={local_rank} but only {torch.cuda.device_count()} GPU(s) are visible: "
            "--nproc-per-node is larger than the GPUs on this node"
        )
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def flight_recorder_env(dump_dir: Path | None) -> dict[str, str]:
    """Settings that make torch's NCCL flight recorder dump on a collective timeout.

    Enabled by ``TORCH_FR_BUFFER_SIZE`` (``train run --flight-recorder N`` or
    ``launch ... --flight-recorder``); the dumps go to ``dump_dir`` (normally
    ``OUT/flight_recorder``) unless a dump path is already set. Returns what it set."""
    try:
        size = int(os.environ.get("TORCH_FR_BUFFER_SIZE") or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or 0)
    except ValueError:
        size = 0
    if size <= 0:
        return {}
    wanted = {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    if dump_dir is not None and not (os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
                                     or os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")):
        dump_dir.mkdir(parents=True, exist_ok=True)
        prefix = str(dump_dir / "nccl_trace_rank_")
        # torch >= 2.7 reads TORCH_FR_DUMP_TEMP_FILE, older ones TORCH_NCCL_DEBUG_INFO_TEMP_FILE.
        wanted.update(TORCH_FR_DUMP_TEMP_FILE=prefix, TORCH_NCCL_DEBUG_INFO_TEMP_FILE=prefix)
    applied = {k: v for k, v in wanted.items() if k not in os.environ}
    os.environ.update(applied)
    return applied


def env_int(name: str, default: int) -> int:
    """An integer from the launcher's environment, or a ConfigError naming it."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = int(raw) if re.fullmatch(r"[0-9]{1,9}", raw) else -1  # ASCII digits only
    if value < 0:
        raise ConfigError(f"environment {name}={raw!r}: expected an integer >= 0 (torchrun sets it)")
    return value


def shared_store_hazard() -> str | None:
    """The warning for torchrun configurations whose restarts can fail, else None.

    torchrun (c10d rendezvous) lets the workers' process group share its rendezvous
    TCPStore by default. The store outlives a worker-group restart, so the restarted
    group can read the previous attempt's keys (a dead rank 0's gloo address, an old
    NCCL unique id) and fail to connect or hang (pytorch/pytorch#135712; reproduced here
    with gloo on torch 2.13). ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` in torchrun's
    environment gives every rendezvous round a fresh store."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    try:
        max_restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    except ValueError:
        max_restarts = 0
    if max_restarts <= 0:
        return None
    return ("torchrun --max-restarts shares its rendezvous store with the process group; a restarted "
            "group can read the previous attempt's keys and fail to connect (pytorch#135712): export "
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 before torchrun")


def init_distributed(device_pref: str = "auto", timeout_s: int = 600,
                     flight_recorder_dir: Path | None = None, nccl_env: dict[str, str] | None = None) -> DistInfo:
    """Read RANK/LOCAL_RANK/WORLD_SIZE (set by torchrun) and start the process group.

    nccl on CUDA, gloo on CPU. ``timeout_s`` bounds every collective: a rank that stops
    answering ends the job with an error instead of a hang. Single process without
    torchrun: no process group at all. ``nccl_env``: NCCL variables the job's settings need,
    set (where the environment has none) before the communicators exist.
    """
    world = env_int("WORLD_SIZE", 1)
    env_int("RANK", 0)
    local_rank = env_int("LOCAL_RANK", 0)
    device = pick_device(device_pref, local_rank)
    if world == 1 and not os.environ.get("MASTER_ADDR"):  # empty = unset, as for the other variables
        return DistInfo(0, 0, 1, device, None)
    backend = "nccl" if device.type == "cuda" else "gloo"
    # Surface NCCL errors/timeouts by tearing the process down (torch >= 2.2 default is 3):
    # the launcher then restarts the group from the last checkpoint instead of hanging.
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    if backend == "nccl":
        flight_recorder_env(flight_recorder_dir)
        for name, value in (nccl_env or {}).items():  # what the job's settings need (read at communicator init)
            os.environ.setdefault(name, value)
    hazard = shared_store_hazard()
    restart = env_int("TORCHELASTIC_RESTART_COUNT", 0)
    if hazard and restart == 0 and env_int("RANK", 0) == 0:
        log.warning("%s", hazard)
    if _store_port_taken():  # torch would retry binding it for about 30 s before failing
        raise _port_in_use()
    try:
        dist.init_process_group(
            backend=backend,
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=device if device.type == "cuda" else None,
        )
    except Exception as exc:  # noqa: BLE001 - every cause becomes one line (exit 2 or 1)
        raise _init_failure(exc, hazard, restart) from None
    return DistInfo(dist.get_rank(), local_rank, dist.get_world_size(), device, backend)


def _store_port_taken() -> bool:
    """Rank 0 of an env:// group (not torchrun's agent store) hosts the TCP store on MASTER_PORT
    on every interface: True when a listening socket already holds that port here."""
    if env_int("RANK", 0) != 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return False
    port = os.environ.get("MASTER_PORT", "")
    if not port.isdigit() or not 0 < int(port) < 65536:
        return False  # torch names a bad value itself
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store does: TIME_WAIT is no conflict
        try:
            probe.bind(("", int(port)))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def _port_in_use() -> ConfigError:
    port, addr = os.environ.get("MASTER_PORT", ""), os.environ.get("MASTER_ADDR", "")
    return ConfigError(f"environment MASTER_PORT={port}: already in use on {addr!r} (rank {env_int('RANK', 0)}; "
                       "another job or a leftover process holds it): choose a free port")


def _init_failure(exc: BaseException, hazard: str | None, restart: int) -> Exception:
    """The one-line error for a failed ``init_process_group``: a MASTER_PORT another
    process holds is a usage error (ConfigError, exit 2); anything else a CollectiveError."""
    detail = " ".join(str(exc).split())[:200]
    rank = env_int("RANK", 0)
    if "EADDRINUSE" in detail or "address already in use" in detail.lower():
        return _port_in_use()
    if hazard and restart > 0:
        return CollectiveError(f"process group init failed on rank {rank} after torchrun restart {restart} "
                               f"({detail}); likely cause: {hazard}")
    return CollectiveError(f"process group init failed on rank {rank} ({type(exc).__name__}: {detail})")


def barrier(info: DistInfo) -> None:
    if info.backend is not None:
        if info.device.type == "cuda":
            dist.barrier(device_ids=[info.device.index])
        else:
            dist.barrier()


def all_true(info: DistInfo, flag: bool) -> bool:
    """True when ``flag`` is true on every rank (one tiny all_reduce)."""
    if info.backend is None:
        return flag
    t = torch.tensor([0.0 if flag else 1.0], device=info.device)
    dist.all_reduce(t)
    return t.item() == 0.0


def min_max(info: DistInfo, value: int) -> tuple[int, int]:
    """The smallest and largest ``value`` over the ranks (one tiny all_reduce)."""
    if info.backend is None:
        return value, value
    t = torch.tensor([-value, value], dtype=torch.int64, device=info.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return -int(t[0]), int(t[1])


def broadcast_object(info: DistInfo, obj, src: int = 0):
    """Rank ``src``'s ``obj`` on every rank (picklable objects; used for small decisions)."""
    if info.backend is None:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, device=info.device if info.device.type == "cuda" else None)
    return box[0]


# ----------------------------------------------------------------------------- collectives


_current_op: str | None = None


@contextlib.contextmanager
def collective(op: str):
    """Mark that the code inside waits on collective ``op`` (for error messages)."""
    global _current_op
    previous, _current_op = _current_op, op
    try:
        yield
    except BaseException as exc:
        if getattr(exc, "collective_op", None) is None:  # the innermost op names the failure
            try:
                exc.collective_op = op
            except (AttributeError, TypeError):
                pass
        raise
    finally:
        _current_op = previous


def current_op() -> str | None:
    return _current_op



_PEER_GONE = ("connection closed", "connection reset", "broken pipe", "connection refused", "socket closed",
              "communicator was aborted", "by peer")


def collective_failure(exc: BaseException, info: DistInfo, timeout_s: int, step: int | str) -> CollectiveError | None:
    """A :class:`CollectiveError` for ``exc`` when it is a distributed failure raised
    inside :func:`collective`, else None (then it is a bug and keeps its traceback)."""
    op = getattr(exc, "collective_op", None) or _current_op
    if info.backend is None or op is None or isinstance(exc, CollectiveError):
        return None
    text = str(exc)
    low = text.lower()
    detail = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    detail = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", detail)  # gloo/c10d source location
    if len(detail) > 240:
        detail = detail[:237] + "..."
    if "timed out" in low or "timeout" in low:
        return CollectiveError(
            f"collective {op} timed out after {timeout_s}s on rank {info.rank} (step {step}): another rank "
            f"did not take part within train.timeout_s={timeout_s}; it is hung or dead, see its log ({detail})"
        )
    distributed = isinstance(exc, getattr(dist, "DistError", ())) or any(s in low for s in _PEER_GONE)
    if distributed:
        return CollectiveError(
            f"collective {op} failed on rank {info.rank} (step {step}): a peer rank is gone ({detail})"
        )
    return None


def first_error(info: DistInfo, err: str | None) -> str | None:
    """Every rank learns whether any rank failed: the error of the lowest failing rank,
    or None. Keeps ranks in step after a local failure (a rank that raised alone would
    leave the others waiting in the next collective)."""
    if info.backend is None or all_true(info, err is None):
        return err
    errors: list[str | None] = [None] * info.world_size
    dist.all_gather_object(errors, err)
    return next((e for e in errors if e is not None), "another rank failed")


# ----------------------------------------------------------------------------- teardown
# Freeing a gloo group joins its worker threads, and the C++ destructor runs with the GIL
# held: torch 2.7 frees the Python ProcessGroup that way (pytorch#154976, in later torch,
# releases the GIL there), and DDP's reducer or another C++ holder can do the same on any
# version (Trainer.release). A worker that has just finished a collective whose tensor
# Python already dropped (that tensor's PyObject then belongs to the C++ tensor: e.g. the
# small all_reduce(MAX) of a helper that has returned) needs the GIL to free it, so
# ~ProcessGroupGloo waits in std::thread::join for the worker and the worker in
# gil_scoped_acquire (~AsyncAllreduceWork -> ~TensorImpl -> decref) for the GIL. Torch
# 2.7.1, `train bench comm` under torchrun: a rank left in destroy_process_group in 5 of 15
# runs (--impl: 4 of 10). A barrier only narrows that window (a worker marks its work done
# before it frees it) and no rank can see its workers go idle, so shutdown() keeps every
# group's objects alive (_kept) and the process ends with os._exit after what a normal exit
# does (end_process, called by the `train` command line): a group is never freed in a
# process that used it. Freed at interpreter finalization instead, such a worker is killed
# mid-destructor (SIGABRT, tests/testlib.py's spawn).

TEARDOWN_BARRIER_S = 60.0
_kept: list = []  # every process group shutdown() took out of use: never destroyed here


def shutdown(ok: bool = True, barrier_s: float = TEARDOWN_BARRIER_S) -> None:
    """End this process's use of the process group, on every exit path, without hanging.

    ``ok`` (the work succeeded on this rank): a barrier bounded by ``barrier_s``, so that no
    rank leaves while a peer's last collective still needs it, then ``destroy_process_group``.
    A peer that is gone or late costs a warning (and no destroy), not a hang. ``ok=False``
    (an error path): neither; a dead peer would hold the barrier until the group's timeout,
    and a broken NCCL group can block in its shutdown. Either way the groups' objects stay
    alive until the process ends (see above): call :func:`end_process` to end it."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    _kept.extend(pg for pg in _all_groups() if not any(pg is k for k in _kept))
    if ok and _bounded_barrier(barrier_s):
        dist.destroy_process_group()


@contextlib.contextmanager
def group_teardown(barrier_s: float = TEARDOWN_BARRIER_S):
    """``with group_teardown(): <collectives>``: :func:`shutdown` when the block ends, with
    ``ok`` only when it raised nothing (SystemExit included: an error path)."""
    ok = False
    try:
        yield
        ok = True
    finally:
        shutdown(ok, barrier_s)


def _all_groups() -> list:
    world = getattr(dist.distributed_c10d, "_world", None)
    groups = list(getattr(world, "pg_map", None) or {})
    default = dist.group.WORLD
    return groups if any(pg is default for pg in groups) or default is None else [default, *groups]


def _bounded_barrier(seconds: float) -> bool:
    """A barrier that waits at most ``seconds``; False (and a warning) when it failed."""
    try:
        nccl = dist.get_backend() == "nccl"
        work = dist.barrier(async_op=True, device_ids=[torch.cuda.current_device()] if nccl else None)
        work.wait(timeout=datetime.timedelta(seconds=seconds))
        return True
    except Exception as exc:  # noqa: BLE001 - the work is done; the teardown goes on
        detail = " ".join(str(exc).split())[:200]
        log.warning("rank %s: teardown barrier failed (%s: %s): another rank has left or is late; "
                    "exiting without waiting for it", os.environ.get("RANK", "?"), type(exc).__name__, detail)
        return False


def group_used() -> bool:
    """Whether a process group lives in this process (kept by :func:`shutdown`, or still
    initialized after an error path): then it should end through :func:`end_process`."""
    return bool(_kept) or (dist.is_available() and dist.is_initialized())


def end_process(code=0) -> NoReturn:
    """End the process as ``sys.exit(code)`` would (``code``: an int, None or a message),
    without the interpreter finalization that would free process groups while gloo's
    threads live: first what a normal exit does - wait for non-daemon threads, run the
    ``atexit`` handlers (logging's flush, ...), flush stdout/stderr - then ``os._exit``."""
    import atexit
    import threading

    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code & 0xFF
    else:
        print(code, file=sys.stderr)
        status = 1
    for step in (getattr(threading, "_shutdown", None), getattr(atexit, "_run_exitfuncs", None)):
        if step is not None:
            try:
                step()
            except Exception:  # noqa: BLE001 - as at a normal exit: reported, the exit goes on
                log.exception("at exit")
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(status)
