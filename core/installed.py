"""The entry points' first check (standard library only): ``python -m train`` or ``python -m
launch`` in a Python without the project's dependencies gets one line saying where they are,
instead of an import traceback."""

from __future__ import annotations

import importlib.util
import sys


def require(program: str, modules: tuple[str, ...]) -> None:
    """Exit 2 with one line naming the first of ``modules`` this Python cannot import."""
    missing = next((m for m in modules if importlib.util.find_spec(m) is None), None)
    if missing:
        sys.stderr.write(f"error: {missing} is not installed in this Python ({sys.executable}): run `make setup` "
                         f"and use .venv/bin/{program}, or `source .venv/bin/activate` first\n")
        raise SystemExit(2)
