"""What a ``train run`` directory holds, for every writer of files to recognise one.

``train`` writes runs; ``launch -o``, ``train preflight --json``, ``bench comm --apply``,
``train data prepare --out`` and the run's own options write single files. None of them may
land inside a run's own entries (its config, metrics, checkpoints, traces, lock, or what
``--overwrite`` moved aside): a launcher script written over a checkpoint's manifest loses
that checkpoint at the next resume. The layout is here, below both packages, so that one
fact serves both (``train.rundir`` re-exports the names).
"""

from __future__ import annotations

import os
from pathlib import Path

from core.errors import InputError
from core.safety import excerpt

LOCK_NAME = ".train.lock"
CONFIG_NAME = "config.yaml"
HISTORY_HEAD = "# Run history of this directory (train run)"
# What an earlier run leaves in OUT (a fresh run into OUT would mix its files with these).
RUN_FILES = (CONFIG_NAME, "metrics.jsonl", "checkpoints", "flight_recorder", "tb", "traces", "wandb")
# What a run writes into its own directory: no other writer's file may be one of them.
RUN_OWNED = (*RUN_FILES, LOCK_NAME)
# --overwrite moves an earlier run's files into OUT/<ASIDE_PREFIX><UTC time>.
ASIDE_PREFIX = "replaced-"


def is_run_dir(path: Path) -> bool:
    """``path`` is (or was) a ``train run`` directory: its lock, or a config.yaml it wrote."""
    if os.path.lexists(path / LOCK_NAME):
        return True
    try:
        with open(path / CONFIG_NAME, "rb") as fh:
            return fh.read(len(HISTORY_HEAD)) == HISTORY_HEAD.encode()
    except OSError:
        return False


def inside_run(path: str | os.PathLike) -> str | None:
    """The entry of a run directory that ``path`` (through symbolic links) is or lies in:
    ``RUN/checkpoints/...``, ``RUN/config.yaml``, ``RUN/replaced-.../...``."""
    real = Path(os.path.realpath(path))
    for parent in real.parents:
        child = real.relative_to(parent).parts[0]
        if (child in RUN_OWNED or child.startswith(ASIDE_PREFIX)) and is_run_dir(parent):
            return str(parent / child)
    return None


def check_not_in_run(shown: str, path: str | os.PathLike, error: type[InputError] = InputError) -> None:
    """Refuse an output file or directory inside a run's own entries: one line (``error``) naming
    the option and value as the user gave them (``shown``) and the run's entry."""
    inside = inside_run(path)
    if inside:
        raise error(f"{shown}: inside another run's {excerpt(inside)} (its own files); use a place of its own")
