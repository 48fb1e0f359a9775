"""Console output of ``train``: one ``logging`` setup with one rank-aware formatter.

Every module logs through ``logging.getLogger(__name__)``; ``setup()`` (called once by the
command line) sends records to stderr (the loggers named in ``stdout=``: to stdout), prefixed
``[rank N]`` when the world has more than one rank. A closed stream (``train run | head -1``)
is dropped quietly: the command goes on, its output goes nowhere (``metrics.jsonl`` keeps it).
``fail`` is the one way a command reports a user error: one line, then exit; under torchrun the
line is also the worker's error record, which torchrun's summary (and ``train run
--nproc-per-node``'s one line) shows.
A leaf module: it imports nothing of ``train`` (only ``core.safety`` for one-line text).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

from core.safety import one_line

ROOT_LOGGER = "train"
# Set by ``train run --nproc-per-node`` for its workers: a worker's error line goes to its error
# record only, and the parent prints the first failed rank's line once.
ERRORS_TO_PARENT = "TRAIN_ERRORS_TO_PARENT"


def rank_prefix() -> str:
    """``[rank N] `` under a multi-rank launcher, else empty (torchrun's RANK/WORLD_SIZE)."""
    if os.environ.get("WORLD_SIZE", "1") == "1":
        return ""
    raw = os.environ.get("RANK", "0")
    return f"[rank {raw if raw.isascii() and raw.isdigit() and len(raw) <= 7 else '?'}] "  # a bad RANK: its own error


class RankFormatter(logging.Formatter):
    """``[rank N] message`` for INFO, ``[rank N] warning: message`` above it; one line each."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.levelno >= logging.WARNING:
            text = f"{record.levelname.lower()}: {text}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return rank_prefix() + text


def setup(level: int | str | None = None, stdout: tuple[str, ...] = ()) -> None:
    """Route the ``train`` loggers to stderr once (level from ``TRAIN_LOG_LEVEL``, default INFO).

    ``stdout``: names of loggers whose records are a command's product (``train run``'s
    progress lines), sent to stdout instead, rank-prefixed, at INFO."""
    level = level or _env_level()
    if _attach(ROOT_LOGGER, sys.stderr):
        logging.getLogger(ROOT_LOGGER).setLevel(level)
    for name in stdout:
        if _attach(name, sys.stdout):
            logging.getLogger(name).setLevel(logging.INFO)


LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _env_level() -> str:
    """``TRAIN_LOG_LEVEL`` (default INFO); another value is a one-line error, exit 2."""
    raw = os.environ.get("TRAIN_LOG_LEVEL") or "INFO"
    if raw.strip().upper() not in LEVELS:
        fail(f"environment TRAIN_LOG_LEVEL={one_line(repr(raw), 60)}: expected one of {', '.join(LEVELS)}", 2)
    return raw.strip().upper()


class _Handler(logging.StreamHandler):
    """A stream handler for which a closed pipe is the reader's choice, not an error."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        if isinstance(sys.exc_info()[1], BrokenPipeError):
            drop_stream(self.stream)
            return
        super().handleError(record)


def drop_stream(stream) -> None:
    """Point a stream whose reader went away (EPIPE) at /dev/null: later writes, and the flush at
    exit, succeed without output."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no file descriptor (a test's StringIO)
        pass


def _attach(name: str, stream) -> bool:
    """Give logger ``name`` one rank-prefixed handler on ``stream`` (False: it has one already)."""
    logger = logging.getLogger(name)
    if any(getattr(h, "_train_console", False) for h in logger.handlers):
        return False
    handler = _Handler(stream)
    handler.setFormatter(RankFormatter())
    handler._train_console = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.propagate = False
    return True


def fail(msg: str, code: int, echo: bool = True) -> None:
    """Print ``error: msg`` on one line (rank-prefixed) and exit with ``code``.

    Under torchrun the line is also written to the worker's error file (``TORCHELASTIC_ERROR_FILE``).
    ``echo=False``: the error file only (the same error is printed by another rank)."""
    line = f"{rank_prefix()}error: {one_line(msg)}"
    if record_error(line) and os.environ.get(ERRORS_TO_PARENT) == "1":
        echo = False  # train run --nproc-per-node prints it
    if echo:
        try:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        except BrokenPipeError:
            drop_stream(sys.stderr)
    sys.exit(code)


def record_error(line: str) -> bool:
    """Write ``line`` as this worker's error record, in the form torchrun's error handler writes
    (its summary shows ``py_callstack``); False when there is no such file or it cannot be written."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return False
    record = {"message": line, "extraInfo": {"py_callstack": line, "timestamp": str(int(time.time()))}}
    try:
        with open(path, "w", encoding="utf-8") as fp:
            json.dump({"message": record}, fp)
    except OSError:
        return False
    return True
