"""Console output of ``train``: one ``logging`` setup with one rank-aware formatter.

Every module logs through ``logging.getLogger(__name__)``; ``setup()`` (called once by the
command line) sends records to stderr (the loggers named in ``stdout=``: to stdout), prefixed
``[rank N]`` when the world has more than one rank. ``fail`` is the one way a command reports a user error: one line, then exit.
A leaf module: it imports nothing of ``train`` (only ``core.safety`` for one-line text).
"""

from __future__ import annotations

import logging
import os
import sys

from core.safety import one_line

ROOT_LOGGER = "train"


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


def _attach(name: str, stream) -> bool:
    """Give logger ``name`` one rank-prefixed handler on ``stream`` (False: it has one already)."""
    logger = logging.getLogger(name)
    if any(getattr(h, "_train_console", False) for h in logger.handlers):
        return False
    handler = logging.StreamHandler(stream)
    handler.setFormatter(RankFormatter())
    handler._train_console = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.propagate = False
    return True


def fail(msg: str, code: int) -> None:
    """Print ``error: msg`` on one line (rank-prefixed) and exit with ``code``."""
    sys.stderr.write(f"{rank_prefix()}error: {one_line(msg)}\n")
    sys.stderr.flush()
    sys.exit(code)
