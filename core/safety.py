"""Input and output safety shared by ``launch`` and ``train``.

Lives in ``launch`` (which never imports torch) so that both command lines use the
same code without an upward import: ``train`` imports it, never the other way round.

* :class:`InputError` - the base of every "bad input" error (``launch``'s ``SpecError``,
  ``train``'s ``ConfigError``): the CLIs print it as one line and exit 2.
* :func:`one_line` / :func:`excerpt` - bounded, single-line, printable renderings of
  user text for error messages (control characters, non-UTF-8 bytes, huge values).
* :func:`load_yaml_file` / :func:`load_yaml_text` - YAML with bounded size, nesting depth
  and alias expansion (no "billion laughs", no RecursionError), safe tags only.
* :func:`check_output_target` / :func:`atomic_write` - the one writer of result files:
  temp file + fsync + rename, and never onto a FIFO, device, socket, directory or
  symlink (a rename would replace the special file by a regular one).
* :func:`parse_ascii_int` / :func:`parse_finite_float` - ASCII digits only (Python's ``int()``
  takes ``'²'``-like Unicode digits), finite numbers, bounded ranges; the click types built on
  them (``StrictInt``, ``harden_click``) are in ``core.clicktypes``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Any

from core.errors import InputError, YamlSyntaxError

MAX_YAML_BYTES = 1 << 20  # 1 MiB: configs and profiles are a few KiB
MAX_YAML_DEPTH = 32  # nesting of mappings/sequences
MAX_YAML_NODES = 20_000  # nodes after alias expansion
MAX_YAML_EXPANDED_CHARS = 4 << 20  # scalar text after alias expansion
EXCERPT_CHARS = 80
NAME_MAX = 255  # bytes in one path component (Linux file systems)
MESSAGE_CHARS = 600


# --------------------------------------------------------------------------- messages


def _printable(text: str) -> str:
    out = []
    for ch in text:
        if "\ud800" <= ch <= "\udfff":  # a non-UTF-8 byte (surrogateescape)
            out.append(f"\\x{ord(ch) - 0xDC00:02x}" if ord(ch) >= 0xDC80 else "\\ufffd")
        elif ch.isprintable() or ch == " ":
            out.append(ch)
        else:
            out.append(ch.encode("unicode_escape").decode("ascii"))
    return "".join(out)


def one_line(message: object, limit: int = MESSAGE_CHARS) -> str:
    """``message`` as one printable line of at most ``limit`` characters."""
    text = " ".join(_printable(str(message)).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def excerpt(value: object, limit: int = EXCERPT_CHARS, tail: int = 0) -> str:
    """A quoted, bounded, printable rendering of a user value for messages; a long one keeps its
    last ``tail`` characters (a path's file name) and loses its middle."""
    text = value if isinstance(value, str) else repr(value)
    text = _printable(text).replace("'", "\\'")
    if len(text) > limit:
        tail = min(tail, limit // 2)
        text = text[: limit - 3 - tail] + "..." + (text[-tail:] if tail else "")
    return f"'{text}'"


def excerpt_path(path: object, limit: int = EXCERPT_CHARS) -> str:
    """:func:`excerpt` of a path that keeps its last component where it can."""
    text = str(path)
    return excerpt(text, limit, tail=len(text.rstrip("/").rsplit("/", 1)[-1]) + 1)


# --------------------------------------------------------------------------- numbers

_ASCII_INT = re.compile(r"[+-]?[0-9]{1,30}")
_ASCII_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


# Besides C0 (NUL, newline, escape...): DEL, NEL and the Unicode line/paragraph separators.
_CONTROL = frozenset("\x7f\x85\u2028\u2029")


def control_chars(text: str) -> str:
    """The first control character in ``text`` ("" when none): never part of a file name,
    path or name a job uses, and a line break in a one-line message."""
    return next((ch for ch in text if ord(ch) < 0x20 or ch in _CONTROL), "")


def probe_path(path: str | os.PathLike, what: str) -> os.stat_result | None:
    """``os.stat`` of a user-given path (``what`` names the option or key): None when nothing is
    there. A name the file system refuses - a component over 255 bytes, a NUL, a symbolic-link
    loop, no permission - is an InputError naming ``what``; ``Path.exists()``/``is_file()``
    raise OSError(ENAMETOOLONG) for it instead of returning False. Check every user path here
    once, at its entry point, before any other predicate sees it."""
    text = os.fspath(path)
    if "\0" in text:
        raise InputError(f"{what} {excerpt(text)}: control characters in a path")
    if (longest := longest_name(text)) > NAME_MAX:  # also below a directory still to be created (stat says ENOENT there)
        raise InputError(f"{what} {excerpt(text)}: File name too long (a name of {longest} bytes, at most {NAME_MAX})")
    try:
        return os.stat(text)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise InputError(f"{what} {excerpt(text)}: {exc.strerror or type(exc).__name__}") from None


def longest_name(path: str) -> int:
    """Bytes of the longest component of ``path`` (what the file system holds at most NAME_MAX of)."""
    return max((len(os.fsencode(part)) for part in path.split("/")), default=0)


def file_kind(mode: int) -> str:
    """'a FIFO', 'a character device'... for the mode of a file that is not regular."""
    return ("a FIFO" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a directory" if stat.S_ISDIR(mode) else "not a regular file")


def parse_ascii_int(what: str, value: object, minimum: int | None = None, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InputError(f"{what}: expected an integer, got {excerpt(value)}")
    if isinstance(value, str):
        if not _ASCII_INT.fullmatch(value.strip()):
            raise InputError(f"{what}: {excerpt(value)} is not an integer (ASCII digits only)")
        value = int(value.strip())
    if minimum is not None and value < minimum:
        raise InputError(f"{what}: must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise InputError(f"{what}: must be at most {maximum}, got {value}")
    return value


def parse_finite_float(what: str, value: object) -> float:
    if isinstance(value, bool):
        raise InputError(f"{what}: expected a number, got {excerpt(value)}")
    if isinstance(value, str):
        if not _ASCII_FLOAT.fullmatch(value.strip()):
            raise InputError(f"{what}: {excerpt(value)} is not a number (ASCII digits only)")
        value = float(value)
    if not isinstance(value, (int, float)):
        raise InputError(f"{what}: expected a number, got {excerpt(value)}")
    if isinstance(value, int) and abs(value) > 2**63:
        raise InputError(f"{what}: {value} is out of range")
    value = float(value)
    if not math.isfinite(value):
        raise InputError(f"{what}: must be a finite number, got {value}")
    return value


# --------------------------------------------------------------------------- YAML


def read_bounded(path: Path, what: str, limit: int = MAX_YAML_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (FIFOs, devices and /proc, /sys
    files refused: a read would block, /proc/kmsg as root, or return whatever the kernel makes)."""
    what = f"{what} " if what else ""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InputError(f"{what}{excerpt_path(path)}: cannot read ({exc.strerror or exc.__class__.__name__})") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{what}{excerpt_path(path)}: is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{what}{excerpt_path(path)}: not a regular file")
    if within(real := resolved(path), KERNEL_TREES):  # /proc/kmsg blocks
        raise InputError(f"{what}{excerpt_path(path)}: {excerpt(real)} is a kernel pseudo-file, not an input file")
    if st.st_size > limit:
        raise InputError(f"{what}{excerpt_path(path)}: {st.st_size} bytes, more than the {limit} allowed")
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise InputError(f"{what}{excerpt_path(path)}: cannot read ({exc.strerror or exc.__class__.__name__})") from None
    if len(data) > limit:
        raise InputError(f"{what}{excerpt_path(path)}: more than {limit} bytes")
    return data


def load_yaml_file(path: Path, what: str) -> Any:
    data = read_bounded(path, what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{what} {excerpt_path(path)}: cannot read (UnicodeDecodeError: not UTF-8)".strip()) from None
    return load_yaml_text(text, f"{what} {excerpt_path(path)}".strip())


def load_yaml_text(text: str, what: str, limit: int = MAX_YAML_BYTES) -> Any:
    """``yaml.safe_load`` with bounded size, depth and alias expansion.

    Depth is checked on the event stream (iterative) before anything is composed, so a
    10 000-deep nesting is refused without recursion; alias expansion is counted on the
    composed node graph before construction, so a billion-laughs document is refused
    after a few thousand steps instead of being expanded."""
    import yaml

    if len(text) > limit:
        raise InputError(f"{what}: {len(text)} characters, more than the {limit} allowed")
    loader = None
    try:
        loader = yaml.SafeLoader(text)  # the reader refuses non-printable characters here
        depth = 0
        while loader.check_event():
            event = loader.peek_event()
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_YAML_DEPTH:
                    raise InputError(f"{what}: nested deeper than {MAX_YAML_DEPTH} levels")
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
            loader.get_event()
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(f"{what}: malformed YAML{_yaml_where(exc)}") from None
    finally:
        if loader is not None:
            loader.dispose()

    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node, what)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(f"{what}: malformed YAML{_yaml_where(exc)}") from None
    except InputError:  # a ValueError too: the checks above
        raise
    except (ValueError, OverflowError) as exc:  # an int of 5000 digits, a date 2026-13-45
        raise YamlSyntaxError(f"{what}: malformed YAML (a value cannot be read: {one_line(exc, EXCERPT_CHARS)})") from None
    except RecursionError:  # cannot happen within MAX_YAML_DEPTH, kept as a last guard
        raise InputError(f"{what}: nested too deeply") from None
    finally:
        loader.dispose()


def _yaml_where(exc) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    where = f" line {mark.line + 1}" if mark else ""
    return where + (f" ({one_line(problem, EXCERPT_CHARS)})" if problem else "")


def _check_expansion(root, what: str) -> None:
    import yaml

    seen, chars, stack = 0, 0, [(root, 1)]
    while stack:
        node, depth = stack.pop()
        seen += 1
        if seen > MAX_YAML_NODES:
            raise InputError(f"{what}: more than {MAX_YAML_NODES} values after expanding aliases (alias bomb?)")
        if isinstance(node, yaml.ScalarNode):
            _check_number(node, what)
            chars += len(node.value)  # a long string aliased many times is a bomb too (repr, messages)
            if chars > MAX_YAML_EXPANDED_CHARS:
                raise InputError(f"{what}: more than {MAX_YAML_EXPANDED_CHARS} characters after expanding "
                                 "aliases (alias bomb?)")
        if depth > MAX_YAML_DEPTH:
            raise InputError(f"{what}: nested deeper than {MAX_YAML_DEPTH} levels (through aliases)")
        if isinstance(node, yaml.SequenceNode):
            stack.extend((child, depth + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            _check_keys(node, what)
            keys = [k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)]
            if len(keys) != len(set(keys)):
                dup = next(k for k in keys if keys.count(k) > 1)
                raise InputError(f"{what}: duplicate key {excerpt(dup)} (line {node.start_mark.line + 1})")
            for key, value in node.value:
                stack.append((key, depth + 1))
                stack.append((value, depth + 1))


_KEY_TAGS = ("tag:yaml.org,2002:str", "tag:yaml.org,2002:merge")
_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
# What YAML 1.2 and a reader agree on: decimal integers (no leading zero), hexadecimal, and
# decimal floats; YAML 1.1 (PyYAML) also reads 010 as 8, 0b11 as 3, 1:30 as 90 and 1_000 as 1000.
_PLAIN_NUMBER = re.compile(r"[-+]?(0|[1-9][0-9]*)|0x[0-9a-fA-F]+"
                           r"|[-+]?(\.[0-9]+|[0-9]+\.[0-9]*)([eE][-+]?[0-9]+)?|[-+]?[0-9]+[eE][-+]?[0-9]+"
                           r"|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)")


def _check_number(node, what: str) -> None:
    """A plain number is written the way it reads: ``steps: 010`` (8 to YAML 1.1, 10 to a person), ``0b11``,
    ``1:30`` (90) or ``1_000`` is a syntax error naming the line (a ``--set`` value then stays the plain string)."""
    if node.style is None and node.tag in _NUMBER_TAGS and not _PLAIN_NUMBER.fullmatch(node.value):
        raise YamlSyntaxError(f"{what}: {excerpt(node.value)} (line {node.start_mark.line + 1}) is not a plain decimal "
                              "number (YAML 1.1 reads octal, binary, base-60 and underscores): write it in decimal, "
                              "or quote it for a string")


def _check_keys(node, what: str) -> None:
    """Mapping keys are strings (or ``<<``): ``1:``, ``true:``, ``2020-01-01:`` or ``[a]:`` as a
    key is a mistake in every file read here, and code downstream handles names as text."""
    import yaml

    for key, _ in node.value:
        if not isinstance(key, yaml.ScalarNode) or key.tag not in _KEY_TAGS:
            shown = f"key {excerpt(key.value)}" if isinstance(key, yaml.ScalarNode) else "a list or mapping as a key"
            kind = key.tag.rsplit(":", 1)[-1]
            raise InputError(f"{what}: {shown} (line {key.start_mark.line + 1}) is not a string ({kind}); quote it")


# --------------------------------------------------------------------------- output files

# Paths a job must never mount, write checkpoints or a run directory to: the root, system
# directories and the pseudo/memory file systems (/dev/shm is the shared-memory mount).
RESERVED_PATHS = ("/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc",
                  "/run", "/sbin", "/sys", "/usr", "/var", "/tmp", "/root", "/home")
RESERVED_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run",
                  "/sbin", "/sys", "/usr", "/var/run", "/var/lib/docker", "/var/lib/containers")


# Kernel pseudo-file systems: a read may block (/proc/kmsg as root) or return whatever the kernel makes.
KERNEL_TREES = ("/proc", "/sys")


def canonical_path(path: str) -> str:
    """``path`` (absolute, POSIX) without ``.``, ``..``, repeated or trailing slashes; POSIX ``normpath``
    keeps a leading ``//`` (the root on Linux, but not equal to ``/etc`` as ``//etc``): one slash."""
    import posixpath

    norm = posixpath.normpath(path)
    return "/" + norm.lstrip("/") if norm.startswith("/") else norm


def reserved_path(path: str) -> bool:
    """``path`` (absolute, POSIX) is ``/``, a system directory or inside /dev, /proc, /sys...
    (``//etc`` and ``/tmp/../etc`` included)."""
    norm = canonical_path(path)
    return norm in RESERVED_PATHS or any(norm.startswith(tree + "/") for tree in RESERVED_TREES)


def reserved_local_path(path: str | os.PathLike) -> bool:
    """A local path that is, or resolves through symbolic links to, a reserved path (``--out link-to-etc``)."""
    return reserved_path(os.path.realpath(os.fspath(path)))


def resolved(path: str | os.PathLike) -> str:
    """The canonical path that ``path`` names on this machine, symbolic links followed."""
    return canonical_path(os.path.realpath(os.fspath(path)))


def within(norm: str, trees: tuple[str, ...]) -> bool:
    """The canonical path ``norm`` is one of ``trees`` or inside one."""
    return any(f"{norm}/".startswith(tree + "/") for tree in trees)


def system_directory(path: str | os.PathLike) -> bool:
    """``path`` resolves to ``/`` or into /etc, /usr, /dev, /proc...: no file is written there."""
    norm = resolved(path)
    return norm == "/" or within(norm, RESERVED_TREES)


def check_output_target(path: str | os.PathLike, what: str = "-o") -> Path:
    """Refuse a target that an atomic rename would destroy or that cannot be written: allowed
    are a missing file in an existing directory, or an existing regular file. Refused: directories,
    symlinks (the rename would replace the link, not its target), FIFOs, character/block devices and
    sockets (``-o /dev/null`` as root would replace /dev/null), any file in ``/`` or a system tree."""
    text = os.fspath(path)
    if text == "":
        raise InputError(f"{what}: empty file name")
    p = Path(text)
    shown = excerpt(text)
    if control_chars(text):
        raise InputError(f"{what} {shown}: control characters in a file name")
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise InputError(f"{what} {shown}: cannot use ({exc.strerror})") from None
    if st is not None:
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            raise InputError(f"{what} {shown}: is a directory; give a file name")
        if stat.S_ISLNK(mode):
            raise InputError(f"{what} {shown}: is a symbolic link; give the real file name")
        if not stat.S_ISREG(mode):
            raise InputError(f"{what} {shown}: is {file_kind(mode)}; only regular files are written")
    parent = p.parent
    if not parent.is_dir():
        raise InputError(f"{what} {shown}: directory {excerpt_path(parent)} does not exist")
    if system_directory(parent):  # as root a rename there replaces /etc/passwd, /usr/bin/bash...
        raise InputError(f"{what} {shown}: {excerpt(os.path.realpath(parent))} is a system directory; write elsewhere")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{what} {shown}: directory {excerpt_path(parent)} is not writable")
    return p


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def atomic_write(path: str | os.PathLike, data, executable: bool = False, what: str = "-o",
                 durable: bool = True) -> None:
    """Write ``data`` (text, or any bytes-like object: no copy) to ``path`` whole or not at all (temp
    file in the same directory, fsync unless not ``durable``, rename); the target is checked first and
    again just before the rename. ``durable=False``: intermediate files a crash only makes redo."""
    p = check_output_target(path, what)
    payload = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    mode = (0o777 if executable else 0o666) & ~_umask()
    try:  # a file replaced keeps its permissions (a chmod 600 config stays private) and, where allowed, owner
        old = os.stat(p)
        mode = (old.st_mode & 0o777) | (((old.st_mode & 0o444) >> 2) if executable else 0)  # no set-id bits
    except FileNotFoundError:
        old = None
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name[:100]}.", suffix=".tmp", dir=str(p.parent))
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        if old is not None and (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
            with contextlib.suppress(OSError):
                os.chown(tmp, old.st_uid, old.st_gid)
        os.chmod(tmp, mode)
        check_output_target(p, what)  # narrow the window: a FIFO/symlink placed meanwhile is refused
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def parse_json(text: str | bytes):
    """``json.loads``; JSON nested too deeply for the parser is a ``json.JSONDecodeError`` like any
    malformed JSON (a ``RecursionError`` got past the handlers of the files we read back)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text if isinstance(text, str) else "", 0) from None
