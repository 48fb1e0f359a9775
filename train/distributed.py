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

SIGTERM/SIGINT handling (graceful stop) lives in :mod:`train.preemption`.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

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
                     flight_recorder_dir: Path | None = None) -> DistInfo:
    """Read RANK/LOCAL_RANK/WORLD_SIZE (set by torchrun) and start the process group.

    nccl on CUDA, gloo on CPU. ``timeout_s`` bounds every collective: a rank that stops
    answering ends the job with an error instead of a hang. Single process without
    torchrun: no process group at all.
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
    hazard = shared_store_hazard()
    restart = env_int("TORCHELASTIC_RESTART_COUNT", 0)
    if hazard and restart == 0 and env_int("RANK", 0) == 0:
        log.warning("%s", hazard)
    try:
        dist.init_process_group(
            backend=backend,
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=device if device.type == "cuda" else None,
        )
    except Exception as exc:  # noqa: BLE001 - every cause becomes one line (exit 2 or 1)
        raise _init_failure(exc, hazard, restart) from None
    return DistInfo(dist.get_rank(), local_rank, dist.get_world_size(), device, backend)


def _init_failure(exc: BaseException, hazard: str | None, restart: int) -> Exception:
    """The one-line error for a failed ``init_process_group``: a MASTER_PORT another
    process holds is a usage error (ConfigError, exit 2); anything else a CollectiveError."""
    detail = " ".join(str(exc).split())[:200]
    rank = env_int("RANK", 0)
    if "EADDRINUSE" in detail or "address already in use" in detail.lower():
        port = os.environ.get("MASTER_PORT", "")
        return ConfigError(f"environment MASTER_PORT={port}: already in use on {os.environ.get('MASTER_ADDR', '')!r} "
                           f"(rank {rank}; another job or a leftover process holds it): choose a free port")
    if hazard and restart > 0:
        return CollectiveError(f"process group init failed on rank {rank} after torchrun restart {restart} "
                               f"({detail}); likely cause: {hazard}")
    return CollectiveError(f"process group init failed on rank {rank} ({type(exc).__name__}: {detail})")


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


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
