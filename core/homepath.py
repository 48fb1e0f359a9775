"""One rule for ``~`` in the paths a user gives (docs/safety.md, "Paths and ``~``"): expanded for
paths used on this machine, refused with a hint for paths a rendered job uses on its nodes.
A leaf: ``core.errors`` and ``core.safety`` only."""

from __future__ import annotations

import os

from core.errors import InputError
from core.safety import excerpt


def expand_home(path: str, what: str) -> str:
    """A path the user gave for this machine, with a leading ``~`` or ``~user`` expanded as a shell
    would at the start of a word (it does not in ``--opt=~/x``, ``--set key=~/x``, YAML or
    ``env X=~/x``). ``~user`` naming no user here, or ``~`` without a home, is an InputError
    naming ``what``: such a path never becomes a directory named ``~``. Other paths unchanged."""
    if not isinstance(path, str) or not path.startswith("~"):
        return path
    expanded = os.path.expanduser(path)
    if expanded.startswith("~"):
        user = path[1:].split("/", 1)[0]
        why = f"no user {excerpt(user)} on this machine" if user else "no home directory ($HOME unset)"
        raise InputError(f"{what} {excerpt(path)}: '~' cannot be expanded ({why}); give the full path")
    return expanded


REMOTE_HOME_HINT = ("'~' is not expanded in a job that runs on other machines (and maybe as another user); "
                    "give the absolute path")


def refuse_home(path: str, what: str, error: type[InputError] = InputError) -> None:
    """A path a rendered job uses on its nodes starts with ``~``: one line with the hint."""
    if isinstance(path, str) and path.startswith("~"):
        raise error(f"{what} {excerpt(path)}: {REMOTE_HOME_HINT}")
