"""The shell blocks of README.md and docs/*.md, and the script that runs a page's blocks.

Convention (summarised in tests/test_docs_commands.py):

* A fenced block tagged ``bash``, ``sh`` or ``shell`` holds commands; ``console`` holds
  ``$ ``-prompted commands and their output (only the prompted lines run). Every other
  fence needs a language tag naming what it is (``text`` for output, ``json``, ``yaml`` ...)
  and is not executed; an untagged fence or an indented code block is an error, so no
  command hides in one.
* A block runs as written, in the page's order, in one bash session (``set -euo pipefail``)
  whose working directory is a scratch directory holding links to the repository's top-level
  entries: variables, files and ``cd`` carry over from one block of a page to the next. New
  files land in the scratch directory; a command that writes under a linked entry
  (``scripts/``, ``k8s/`` ...) writes into the checkout, so such a command is marked.
* ``<!-- docs-test: render REASON -->`` on the line(s) just before a block: it cannot run
  here as written (REASON: GPUs, a cluster). ``launch`` commands in it still run (rendering
  needs no GPU); every other command is checked instead (see :mod:`docs_render`).
* ``<!-- docs-test: skip REASON -->``: not exercised at all; only for what cannot be
  (building an image, downloads).
* ``<!-- docs-test: setup`` ... ``-->``: commands (hidden when the page is rendered) that
  prepare what the page's examples assume exists, e.g. a corpus to tokenize; run first.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

SHELL_LANGS = {"bash", "sh", "shell", "console"}
OTHER_LANGS = {"text", "json", "yaml", "toml", "python", "dockerfile", "diff", "ini", "csv"}
MARKER = re.compile(r"<!--\s*docs-test:\s*(render|skip|setup)\b(.*?)-->", re.S)
# commands of a render block that bash runs itself (no GPU involved)
RUN_IN_RENDER = {"launch", "export", "cd", "mkdir", "cat", "echo", "ls", "cp", "unset", "test", "["}
ASSIGNMENTS = re.compile(r"""((?:[A-Za-z_][A-Za-z0-9_]*=(?:'[^']*'|"[^"]*"|\S+)\s+)*)(.*)""", re.S)
OPERATORS = {"|", "||", "&&", ";", "&", "|&", ";;"}


@dataclass
class Block:
    lang: str
    text: str
    line: int  # 1-based line of the block's first content line in the page
    mode: str = "run"  # run | render | skip
    reason: str = ""


@dataclass
class Page:
    path: Path
    blocks: list[Block] = field(default_factory=list)
    setup: list[tuple[int, str]] = field(default_factory=list)  # (line, commands)
    problems: list[str] = field(default_factory=list)


def parse_page(path: Path) -> Page:
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").parse(path.read_text())
    page, marked = Page(path), None
    for i, tok in enumerate(tokens):
        where = f"{path.name}:{tok.map[0] + 1 if tok.map else '?'}"
        if tok.type == "html_block" and "docs-test" in tok.content:
            marked = _marker(page, tok, tokens[i + 1] if i + 1 < len(tokens) else None, where)
        elif tok.type == "code_block":
            page.problems.append(f"{where}: indented code block; fence it with a language tag")
        elif tok.type == "fence":
            lang = tok.info.split()[0] if tok.info.strip() else ""
            if lang in SHELL_LANGS:
                page.blocks.append(Block(lang, tok.content, tok.map[0] + 2, *(marked or ("run", ""))))
            elif lang not in OTHER_LANGS:
                page.problems.append(f"{where}: fence language {lang!r} is not one of "
                                     f"{sorted(SHELL_LANGS | OTHER_LANGS)} (output: text)")
            marked = None
    return page


def _marker(page: Page, tok, nxt, where: str) -> tuple[str, str] | None:
    """(mode, reason) for the block right after a render/skip marker; a setup marker's
    commands go to ``page.setup``."""
    m = MARKER.search(tok.content)
    if not m:
        page.problems.append(f"{where}: malformed docs-test marker {tok.content.strip()[:60]!r}")
        return None
    mode, rest = m.group(1), m.group(2).strip()
    if mode == "setup":
        page.setup.append((tok.map[0] + 2, rest + "\n"))
        return None
    if not rest:
        page.problems.append(f"{where}: docs-test: {mode} needs a reason (what the block needs that is not here)")
    if nxt is None or nxt.type != "fence" or nxt.info.split()[:1] not in ([lang] for lang in SHELL_LANGS):
        page.problems.append(f"{where}: docs-test: {mode} marker is not followed by a shell block")
        return None
    return mode, rest


def logical_lines(block: Block) -> list[tuple[int, str]]:
    """(page line, command) per command of the block: continuation lines joined, console
    output dropped, blank lines and whole-line comments kept (bash ignores them)."""
    out, cur, start = [], "", 0
    for k, raw in enumerate(block.text.splitlines()):
        line = raw
        if block.lang == "console":
            if not cur and not line.startswith("$ "):
                continue
            line = line[2:] if not cur else line
        if not cur:
            start = block.line + k
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        out.append((start, cur + line))
        cur = ""
    if cur:
        out.append((start, cur))
    return out


def command_word(words: list[str]) -> int:
    """Index of the command word (after leading VAR=value assignments)."""
    k = 0
    while k < len(words) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[k]):
        k += 1
    return k


def render_line(line: str, where: str) -> str:
    """A render block's command as bash should run it: as written for ``launch`` and shell
    built-ins, else handed to ``docs_render`` (recorded, checked after the page ran)."""
    stripped = line.strip()
    if not stripped or stripped.startswith("#"):
        return line
    lex = shlex.shlex(stripped, posix=True, punctuation_chars=True)
    lex.whitespace_split, lex.commenters = True, "#"
    words = list(lex)
    if OPERATORS & set(words) or any(w.startswith("<<") for w in words):
        raise ValueError(f"{where}: one simple command per line in a render block (no pipes, ;, &&, "
                         f"here-documents): {stripped[:80]}")
    k = command_word(words)
    if k == len(words) or words[k] in RUN_IN_RENDER:
        return line
    m = ASSIGNMENTS.match(stripped)
    if len(shlex.split(m.group(1))) != k:
        raise ValueError(f"{where}: an assignment before the command has a quoted space: {stripped[:80]}")
    return f"{m.group(1)}docs_render {shlex.quote(where)} {m.group(2)}"


PREAMBLE = r"""set -eEuo pipefail
docs_render() { local where=$1; shift; printf '%s\0' "$where" "$PWD" "$#" "$@" >> "$DOCS_RENDER_LOG"; }
trap 'echo "docs-test: exit status $? at script line $LINENO" >&2' ERR
"""


def page_script(page: Page, rel: str) -> tuple[str, dict[int, str]]:
    """The bash script of a page's setup and runnable/render blocks, and a map from
    script line to 'page:line' for error messages."""
    lines, where = PREAMBLE.splitlines(), {}

    def add(text: str, at: str) -> None:
        for piece in text.splitlines():
            lines.append(piece)
            where[len(lines)] = at

    for line, text in page.setup:
        add(text, f"{rel}:{line} (setup)")
    for block in page.blocks:
        if block.mode == "skip":
            continue
        add(f": docs-test block {rel}:{block.line}", f"{rel}:{block.line}")
        for line, cmd in logical_lines(block):
            at = f"{rel}:{line}"
            add(render_line(cmd, at) if block.mode == "render" else cmd, at)
    return "\n".join(lines) + "\n", where


def read_render_log(path: Path) -> list[tuple[str, str, list[str]]]:
    """(page:line, working directory, argv) of every command a render block handed over."""
    if not path.exists():
        return []
    parts = path.read_bytes().decode().split("\0")[:-1]
    out, k = [], 0
    while k < len(parts):
        at, cwd, n = parts[k], parts[k + 1], int(parts[k + 2])
        out.append((at, cwd, parts[k + 3:k + 3 + n]))
        k += 3 + n
    return out
