"""The training program (``--entrypoint``) and how torchrun starts it.

torchrun parses its own options up to the program, its first positional argument; everything
after it goes to the program unchanged. So the program word - the executable, the module after
``python -m`` or the script after ``python`` - never starts with '-'.
"""

from __future__ import annotations

import shlex

from core.errors import SpecError
from core.homepath import refuse_home
from core.safety import excerpt
from launch.spec import check_exec_string, reject_nul


def parse_entrypoint(value: str) -> tuple[str, ...]:
    reject_nul("--entrypoint", value)
    try:
        tokens = tuple(shlex.split(value))
    except ValueError as exc:
        raise SpecError(f"--entrypoint {value!r}: {exc}") from None
    for token in tokens:
        check_exec_string("--entrypoint word", token)
    if not tokens or not tokens[0].strip():  # '' or "' '": no program to run
        raise SpecError("--entrypoint is empty" if not tokens else f"--entrypoint {value!r}: the program name is empty")
    if tokens[0].startswith("-"):  # would be read as a torchrun option
        raise SpecError(f"--entrypoint {value!r}: must start with a program, not an option")
    # torchrun parses its options up to the program (its first positional argument): a module or
    # script name that starts with '-' would be one of them (`python -m --nproc-per-node=64 x`)
    args = program_args(tokens)
    program = args[1] if args[0] in ("-m", "--no-python") else args[0]
    refuse_home(tokens[0], "--entrypoint program", SpecError)
    if args[0] != "-m":  # a script path (a module name never starts with '~')
        refuse_home(program, "--entrypoint script", SpecError)
    if not program.strip() or program.startswith("-"):
        raise SpecError(f"--entrypoint {excerpt(value)}: the module or script name {excerpt(program)} "
                        "must not be empty or start with '-' (torchrun would read it as its own option)")
    return tokens


PYTHONS = ("python", "python3")


def program_args(entrypoint: tuple[str, ...]) -> list[str]:
    """How torchrun starts the training program.

    ``python -m pkg ...`` -> ``-m pkg ...`` and ``python script.py ...`` -> ``script.py ...``
    (torchrun runs them with its own interpreter, the ``python`` on the PATH); anything else,
    an interpreter named by its path (``/opt/venv/bin/python -m pkg``) included, runs as a
    plain executable through ``--no-python``.
    """
    head, rest = entrypoint[0], list(entrypoint[1:])
    if head in PYTHONS and rest:
        if rest[0] == "-m" and len(rest) >= 2:
            return ["-m", *rest[1:]]
        if rest[0].endswith(".py"):
            return rest
    return ["--no-python", *entrypoint]
