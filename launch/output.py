"""Write a rendered result to stdout or, atomically, to a regular file (``core.safety``)."""

from __future__ import annotations

import os
import re
import sys

from core.errors import SpecError
from core.runlayout import check_not_in_run
from core.safety import atomic_write, check_output_target, control_chars, excerpt, excerpt_path, resolved, within


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
            raise SpecError(f"-o {excerpt(output)}: is the input file {excerpt_path(path)}; write elsewhere")


def check_not_inside(output: str | None, directories) -> None:
    """``-o`` is not inside any of ``directories`` ((what, path) pairs: the launch package, whose
    built-in profiles and templates a script would replace, and ``--venv``), symbolic links followed."""
    if output in (None, "", "-") or control_chars(output):  # check_target refuses those names
        return
    target = resolved(output)
    for what, directory in directories:
        if directory and within(target, (resolved(directory),)):
            raise SpecError(f"-o {excerpt(output)}: inside {what} {excerpt_path(directory)}; write elsewhere")


def named_files(args) -> list[str]:
    """The paths a list of words may name (``--config X``, ``--set data.path=X``, ``A:B`` path
    lists): each word, what follows the ``=`` of KEY=VALUE and each part of a ':' or ','
    separated list. Only those that exist here matter."""
    names = []
    for arg in args:
        value = arg.split("=", 1)[1] if "=" in arg else arg
        names += [arg, value, *re.split(r"[:,]", value)]
    return names


def job_inputs(spec) -> list[str]:
    """Every file the job names that ``-o`` must never replace: profile, fabric, mount sources, an
    enroot image file, and the paths in the entrypoint, the training arguments and --env values."""
    words = [*spec.entrypoint, *spec.train_args, *(value for _, value in spec.env)]
    image = [spec.image] if spec.image.startswith("/") else []
    return [str(spec.profile.path), str(spec.fabric.path), *(m.source for m in spec.mounts), *image,
            *named_files(words)]


def write(text: str, output: str | None, executable: bool) -> None:
    """stdout without ``-o``; otherwise a whole-file replacement of a regular file (never a
    FIFO, device, socket or symlink). Scripts get the execute bit."""
    if output is None or output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    atomic_write(output, text, executable=executable, what="-o")
