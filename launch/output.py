"""Write a rendered result to stdout or, atomically, to a regular file (``launch.safety``)."""

from __future__ import annotations

import sys

from launch.safety import atomic_write, check_output_target


def check_target(output: str | None) -> None:
    """Fail before rendering when ``-o`` cannot be written (nothing is touched)."""
    if output is None or output == "-":
        return
    check_output_target(output, "-o")


def write(text: str, output: str | None, executable: bool) -> None:
    """stdout without ``-o``; otherwise a whole-file replacement of a regular file (never a
    FIFO, device, socket or symlink). Scripts get the execute bit."""
    if output is None or output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    atomic_write(output, text, executable=executable, what="-o")
