"""Error types of ``launch`` (a leaf module: it imports nothing of the project).

Every user-input problem is an ``InputError``: the CLIs print it as one line and exit 2.
``train`` reuses ``InputError`` so one guard covers both command lines.
"""

from __future__ import annotations


class InputError(ValueError):
    """A user input problem: one line on stderr, exit status 2."""


class YamlSyntaxError(InputError):
    """Text that is not YAML (as opposed to YAML over the size/depth/alias bounds)."""


class SpecError(InputError):
    """A problem in a job description (flags, profile or fabric); one line, exit 2."""
