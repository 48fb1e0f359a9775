"""Click parameter types for both command lines (a leaf: click and ``core.safety`` only).

* :class:`StrictInt` / :class:`StrictFloat` - ASCII digits only (Python's ``int()`` takes
  ``'²'``-like Unicode digits), finite numbers and bounded ranges; a bad value is a usage
  error (exit 2).
* :func:`harden_click` - gives every integer/float option of a command tree these types and
  every ``click.Path`` the control-character check and ``~`` expansion, so a new option is
  covered by construction; :class:`LocalPath` gives a text option naming a local path (or a
  name) the same ``~`` rule.
"""

from __future__ import annotations

import click

from core.errors import InputError
from core.homepath import expand_home
from core.safety import control_chars, excerpt, parse_ascii_int, parse_finite_float


class StrictInt(click.ParamType):
    """ASCII digits, optional bounds; a bad value is a usage error (exit 2)."""

    name = "integer"

    def __init__(self, minimum: int | None = None, maximum: int | None = None):
        self.minimum, self.maximum = minimum, maximum

    def convert(self, value, param, ctx):
        try:
            return parse_ascii_int(f"'{param.opts[0]}'" if param else "value", value, self.minimum, self.maximum)
        except InputError as exc:
            self.fail(str(exc).split(": ", 1)[-1], param, ctx)


class StrictFloat(click.ParamType):
    name = "number"

    def __init__(self, minimum: float | None = None):
        self.minimum = minimum

    def convert(self, value, param, ctx):
        try:
            number = parse_finite_float("value", value)
        except InputError as exc:
            self.fail(str(exc).split(": ", 1)[-1], param, ctx)
        if self.minimum is not None and number < self.minimum:
            self.fail(f"must be at least {self.minimum:g}, got {number:g}", param, ctx)
        return number


def _expand(type_, value, param, ctx):
    """``value`` with a leading ``~``/``~user`` expanded (:func:`core.safety.expand_home`)."""
    try:
        return expand_home(value, "")
    except InputError as exc:  # click names the option: the message starts with the value
        type_.fail(str(exc).strip(), param, ctx)


class CleanPath(click.Path):
    """click.Path refusing '' and control characters (a NUL makes ``os.stat`` raise), first;
    a leading ``~`` is expanded as the shell does (``--out=~/x`` reaches us unexpanded)."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and (not value or control_chars(value)):  # '' would become Path('.')
            self.fail(f"{excerpt(value)}: control characters in a path" if value else "empty path", param, ctx)
        return super().convert(_expand(self, value, param, ctx), param, ctx)


class LocalPath(click.ParamType):
    """A path on this machine given as text (or a name: ``--config tiny``, ``--profile h100``):
    unchanged, except a leading ``~``/``~user``, expanded as the shell does at the start of a word
    (it does not in ``--opt=~/x``). The option's own checks (empty, missing...) follow."""

    name = "path"

    def convert(self, value, param, ctx):
        return _expand(self, value, param, ctx)


def harden_click(command) -> None:
    """Give every integer/float parameter of ``command`` (and its subcommands) the strict
    types: a new ``type=int`` option is ASCII-only, bounded and finite by construction;
    every ``click.Path`` refuses an empty name and control characters (NUL, newline)."""
    commands = [command]
    while commands:
        cmd = commands.pop()
        commands.extend(getattr(cmd, "commands", {}).values())
        for param in cmd.params:
            t = param.type
            if isinstance(t, click.IntRange):
                lo = None if t.min is None else t.min + (1 if t.min_open else 0)
                hi = None if t.max is None else t.max - (1 if t.max_open else 0)
                param.type = StrictInt(lo, hi)
            elif isinstance(t, click.types.IntParamType):
                param.type = StrictInt(-(2**63), 2**63 - 1)
            elif isinstance(t, click.FloatRange):
                param.type = StrictFloat(t.min)
            elif isinstance(t, click.types.FloatParamType):
                param.type = StrictFloat()
            elif type(t) is click.Path:  # same settings, control characters refused first
                t.__class__ = CleanPath
