"""Write a rendered result to stdout or, atomically, to a file."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from launch.spec import SpecError


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def check_target(output: str | None) -> None:
    """Fail before rendering when ``-o`` cannot be written (nothing is touched)."""
    if output is None or output == "-":
        return
    path = Path(output)
    if path.is_dir():
        raise SpecError(f"-o {output}: is a directory; give a file name")
    if not path.parent.is_dir():
        raise SpecError(f"-o {output}: directory {str(path.parent)!r} does not exist")


def write(text: str, output: str | None, executable: bool) -> None:
    """stdout without ``-o``; otherwise temp file in the same directory + rename, so an
    existing file is either left alone or replaced whole. Scripts get the execute bit."""
    if output is None or output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    check_target(output)
    path = Path(output)
    mode = (0o777 if executable else 0o666) & ~_umask()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
