"""Write a rendered result to stdout or, atomically, to a regular file (``launch.safety``)."""

from __future__ import annotations

import os
import sys

from launch.errors import SpecError
from launch.runlayout import check_not_in_run
from launch.safety import atomic_write, check_output_target, excerpt


def check_target(output: str | None) -> None:
    """Fail before rendering when ``-o`` cannot be written (nothing is touched)."""
    if output is None or output == "-":
        return
    check_output_target(output, "-o")
    check_not_in_run(f"-o {excerpt(output)}", output)  # a script over a checkpoint's manifest loses the checkpoint


def check_not_input(output: str | None, inputs) -> None:
    """``-o`` is none of the files the job was read from (``--profile x.yaml -o x.yaml`` would
    replace the profile with the script)."""
    if output is None or output == "-" or not os.path.exists(output):
        return
    for path in inputs:
        if path and os.path.exists(path) and os.path.samefile(output, path):
            raise SpecError(f"-o {excerpt(output)}: is the input file {excerpt(str(path))}; write elsewhere")


def named_files(args) -> list[str]:
    """The paths the training arguments name (``--config X``, ``--set data.path=X``): each
    argument, and what follows the ``=`` of KEY=VALUE. Only those that exist here matter."""
    names = []
    for arg in args:
        names.append(arg)
        if "=" in arg:
            names.append(arg.split("=", 1)[1])
    return names


def write(text: str, output: str | None, executable: bool) -> None:
    """stdout without ``-o``; otherwise a whole-file replacement of a regular file (never a
    FIFO, device, socket or symlink). Scripts get the execute bit."""
    if output is None or output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    atomic_write(output, text, executable=executable, what="-o")
