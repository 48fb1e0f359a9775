"""Jinja environment and the quoting every value takes on its way into a template.

Quoting is structural: the environment's ``finalize`` hook quotes every ``{{ ... }}``
result that is not already marked ``Quoted``, for the template's language
(``*.yaml.j2``: YAML double-quoted scalar unless it is a plain identifier; anything
else: one shell word). A new template variable is therefore quoted even when its
author forgets a filter. The quoted forms never contain a line break or a control
character, so they are also safe inside ``#`` comments (a comment cannot end early and
turn the rest of a value into code or markup).

Every piece of shell quoting in ``launch`` is here: backends build plain ``str`` values
(user data) and ``Shell`` fragments (their own shell code), never quote themselves.

Filters (each returns ``Quoted``):

* ``sh``      - one shell word: ``shlex.quote`` for printable text, ``$'...'`` (ANSI-C, every
                byte escaped) for text with ``$``, backticks, backslashes, control characters,
                non-printable or non-UTF-8 characters; ``Shell`` fragments (written by a template author) unchanged
* ``shwords`` - a list of ``sh`` words joined by spaces
* ``comment`` - free text for a comment line (control characters flattened to spaces)
* ``q``       - a YAML double-quoted scalar (every non-printable/non-ASCII char escaped)
* ``kq``      - ``q`` for strings Kubernetes expands ``$(VAR)`` in (command, args, env
                values): ``$`` is doubled so the value reaches the process unchanged
"""

from __future__ import annotations

import re
import shlex
from functools import lru_cache
from pathlib import Path

from core.errors import SpecError
from core.safety import excerpt_path

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"


class Quoted(str):
    """Text already quoted/escaped for the output language: rendered as is."""


class Shell(str):
    """A shell expression written by a template author (e.g. ``"$rdzv_endpoint"``), never by a
    user: rendered as is where a value would be quoted."""


# YAML plain scalars left unquoted by the default: identifiers that YAML 1.1/1.2 cannot
# read as anything but a string (no bool/null words, no numbers, no indicators).
_YAML_PLAIN = re.compile(r"[A-Za-z][A-Za-z0-9_./-]*")
_YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}


def _printable(text: str) -> bool:
    """Printable and encodable: no control characters, line breaks or lone surrogates."""
    return text.isprintable() and not any("\ud800" <= ch <= "\udfff" for ch in text)


def _ansi_c(text: str) -> str:
    """bash ``$'...'``: printable ASCII kept, every other byte as \\xHH (byte-exact, one line)."""
    out = ["$'"]
    for ch in text:
        if ch in "\\'":
            out.append("\\" + ch)
        elif " " <= ch <= "~":
            out.append(ch)
        else:
            out.extend(f"\\x{b:02x}" for b in ch.encode("utf-8", "surrogateescape"))
    out.append("'")
    return "".join(out)


def sh(token: object) -> Quoted:
    if isinstance(token, (Shell, Quoted)):
        return Quoted(token)
    text = str(token)
    if not _printable(text) or "$" in text or "`" in text or "\\" in text:
        # ANSI-C form also for '$' and '`': the same word, and shellcheck does not suspect a
        # forgotten expansion (SC2016) in it; and for backslashes: one before a closing quote reads as an
        # escaped quote (SC1003)
        return Quoted(_ansi_c(text))
    quoted = shlex.quote(text)
    if quoted == text and ("," in quoted or quoted.startswith("=")):
        # safe as is, but shellcheck reads commas in arrays (SC2054) and `X==v` (SC1097) as mistakes
        return Quoted(f"'{quoted}'")
    return Quoted(quoted)


def shwords(tokens) -> Quoted:
    return Quoted(" ".join(sh(token) for token in tokens))


def command_line(words) -> str:
    """A command as the user would type it (POSIX shell words), for the provenance header."""
    return shlex.join(words)


def comment(text: object) -> Quoted:
    return Quoted("".join(ch if _printable(ch) else " " for ch in str(text)).rstrip())


def yaml_quote(text: object) -> Quoted:
    out = ['"']
    for ch in str(text):
        code = ord(ch)
        if 0xD800 <= code <= 0xDFFF:
            raise SpecError(f"a value with a non-UTF-8 byte ({excerpt_path(text)}) cannot go into a Kubernetes "
                            "manifest (it holds text only)")
        if ch in '"\\':
            out.append("\\" + ch)
        elif 0x20 <= code < 0x7F:
            out.append(ch)
        elif code <= 0xFF:
            out.append(f"\\x{code:02x}")
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return Quoted("".join(out))


def k8s_quote(text: object) -> Quoted:
    return yaml_quote(str(text).replace("$", "$$"))


def _number(value: object) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def _finalize_shell(value: object) -> str:
    if isinstance(value, Quoted):
        return value
    number = _number(value)
    return number if number is not None else sh(value)


def _finalize_yaml(value: object) -> str:
    if isinstance(value, Quoted):
        return value
    number = _number(value)
    if number is not None:
        return number
    text = str(value)
    if _YAML_PLAIN.fullmatch(text) and text.lower() not in _YAML_WORDS:
        return text
    return yaml_quote(text)


def is_yaml_template(name: str) -> bool:
    return name.endswith((".yaml.j2", ".yml.j2"))


@lru_cache(maxsize=2)
def environment(language: str = "shell"):
    """The Jinja environment for ``language`` ("shell" or "yaml")."""
    import jinja2  # lazy: keeps `launch --help` fast

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # HTML escaping; our escaping is the finalize hook below
        finalize=_finalize_yaml if language == "yaml" else _finalize_shell,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(sh=sh, shwords=shwords, comment=comment, q=yaml_quote, kq=k8s_quote)
    return env


def render(template: str, **context) -> str:
    language = "yaml" if is_yaml_template(template) else "shell"
    return environment(language).get_template(template).render(**context)


def group_args(tokens: list[str]) -> list[list[str]]:
    """Pair ``--option value`` for readability (one group per line in a bash array)."""
    groups: list[list[str]] = []
    for token in tokens:
        previous = groups[-1] if groups else None
        if (
            previous is not None
            and len(previous) == 1
            and previous[0].startswith("-")
            and not isinstance(previous[0], Shell)
            and "=" not in previous[0]
            and previous[0] not in ("--standalone", "--no-python")
            and not str(token).startswith("-")
        ):
            previous.append(token)
        else:
            groups.append([token])
    return groups


def header_lines(command: str, spec) -> list[str]:
    """Provenance comment block shared by every output."""
    profile, fabric = spec.profile, spec.fabric
    lines = [
        f"Generated by: {command}",
        "Do not edit by hand: change the command above and render again.",
        f"Profile {profile.name}: {profile.description}",
        f"  GPU {profile.gpu_model} ({profile.arch}), {profile.interconnect}",
        f"  FP8: {', '.join(profile.fp8) or 'none'}; image target: {profile.image_target}",
        f"Fabric {fabric.name}: {fabric.description}",
    ]
    lines += [f"Note: {note}" for note in profile.notes + fabric.notes]
    return lines
