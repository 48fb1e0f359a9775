"""Graceful stop on SIGTERM/SIGINT: finish the step, checkpoint on every rank, exit 0.

:class:`Preemption` sets a flag from the signal; the training loop agrees on it in its
per-step all_reduce. A watcher thread makes sure the process is gone within the grace
period even if a collective never returns.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

from train.distributed import current_op

log = logging.getLogger(__name__)


def torchrun_kill_after_s() -> int | None:
    """Seconds torchrun waits after forwarding SIGTERM before it SIGKILLs the workers,
    when a worker can know it: 30 on torch without ``--shutdown-timeout`` (2.11 has
    none), ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` on newer torch; None outside torchrun, when
    torchrun does not handle SIGTERM (``--signals-to-handle`` without it, as the scripts
    ``launch`` renders start it: they signal the workers themselves) or when only
    torchrun's command line knows."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return None
    # what torchrun handles: it exports TORCHELASTIC_SIGNALS_TO_HANDLE to the workers where it
    # reads --signals-to-handle; PET_SIGNALS_TO_HANDLE is that option's environment form
    handled = os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE", os.environ.get("PET_SIGNALS_TO_HANDLE"))
    if handled is not None and "SIGTERM" not in (s.strip() for s in handled.split(",")):
        return None
    try:
        import inspect

        from torch.distributed.launcher.api import LaunchConfig

        configurable = "shutdown_timeout" in inspect.signature(LaunchConfig).parameters
    except Exception:  # noqa: BLE001 - unknown torch layout: say nothing
        return None
    if not configurable:
        return 30
    raw = os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
    try:
        return int(raw) if raw else None
    except ValueError:
        return None


_active_preemption: Preemption | None = None
_watcher_started = False


def _watch_wakeup_fd(read_fd: int) -> None:
    while True:
        try:
            data = os.read(read_fd, 64)
        except OSError:
            return
        if not data:
            return
        for signum in PREEMPT_SIGNALS:
            if signum in data and _active_preemption is not None:
                _active_preemption._trip(signum)


# SIGINT (Ctrl-C, or torchrun/srun forwarding it) is handled exactly like SIGTERM: a
# KeyboardInterrupt in the middle of a step would lose the step and print a traceback.
PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preemption:
    """SIGTERM or SIGINT (Kubernetes eviction, Slurm ``--signal``, torchrun forwarding its
    own SIGTERM, Ctrl-C) sets a flag; the loop finishes the current step, every rank agrees to stop
    (the per-step all_reduce), writes a checkpoint and exits 0.

    Python runs signal handlers in the main thread between bytecodes, so a main thread
    stuck in a collective would never notice the signal. The interpreter's C-level
    handler also writes the signal number to the wakeup fd: a watcher thread reads it at
    once and arms a timer. If the process is still alive ``grace_s`` later it exits on
    its own: 0 when the checkpoint was written (e.g. stuck tearing down the process
    group), 1 when not (the previous complete checkpoint stays the latest).

    One watcher per process; the most recently installed instance receives the signal."""

    def __init__(self, grace_s: float, chosen: bool = True) -> None:
        self.grace_s = grace_s
        self.chosen = chosen  # grace_s was set by the user (the default is not warned about)
        self.requested = False
        self.signum = 0  # the signal that set requested
        self.at = 0.0
        self.checkpointed = False
        self._lock = threading.Lock()

    def install(self) -> None:
        global _active_preemption, _watcher_started
        if threading.current_thread() is not threading.main_thread():
            return
        _active_preemption = self
        for signum in PREEMPT_SIGNALS:
            signal.signal(signum, self._handler)
        kill_after = torchrun_kill_after_s()
        if kill_after is not None and self.chosen and self.grace_s >= kill_after and os.environ.get("RANK", "0") == "0":
            log.warning("torchrun SIGKILLs the workers %ds after it forwards SIGTERM, before "
                        "train.shutdown_grace_s=%gs runs out: a preemption checkpoint must finish within "
                        "%ds (raise TORCH_ELASTIC_SHUTDOWN_TIMEOUT where torch supports it)",
                        kill_after, self.grace_s, kill_after)
        if not _watcher_started:
            read_fd, write_fd = os.pipe()
            os.set_blocking(write_fd, False)
            signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
            threading.Thread(target=_watch_wakeup_fd, args=(read_fd,), name="sigterm-watch", daemon=True).start()
            _watcher_started = True

    def take_over(self, earlier: "Preemption | None") -> None:
        """A stop that reached ``earlier`` (the handler installed before this one, e.g. between
        two trainers of one benchmark) applies to this one."""
        if earlier is not None and earlier.requested:
            self._trip(earlier.signum or signal.SIGTERM)

    def _handler(self, signum, frame) -> None:  # noqa: ARG002
        self._trip(signum)

    def _trip(self, signum: int = signal.SIGTERM) -> None:
        name = signal.Signals(signum).name
        with self._lock:
            if self.requested:
                return
            self.requested = True
            self.signum = signum
            self.at = time.monotonic()
        log.info("%s received; checkpointing after this step (exit within train.shutdown_grace_s=%gs)",
                 name, self.grace_s)
        threading.Thread(target=self._expire, name="sigterm-grace", daemon=True).start()

    def _expire(self) -> None:
        time.sleep(self.grace_s)
        if self.checkpointed:
            log.info("checkpoint written; still not exited %gs after SIGTERM, forcing exit", self.grace_s)
            code = 0
        else:
            op = current_op()
            where = f" (waiting in {op})" if op else ""
            log.error("SIGTERM: no checkpoint within train.shutdown_grace_s=%gs%s; exiting without one, "
                      "the previous complete checkpoint is kept", self.grace_s, where)
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
