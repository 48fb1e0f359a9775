"""Benchmark output shared by every ``train bench`` command: a printed Markdown table,
``NAME.json`` (all rows), ``NAME.md`` (the table) and ``NAME.png`` (a chart); and the
check of a comma-separated option (``choice_list``) the commands share."""

from __future__ import annotations

import atexit
import io
import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Sequence

from core.safety import atomic_write, check_output_target, excerpt, excerpt_path

log = logging.getLogger(__name__)


def comma_list(text, option: str) -> list[str]:
    """``a, b`` (or a YAML list) -> ``["a", "b"]``; ValueError (a usage error) when the list or
    one of its items is empty (``a,,b``, ``a,``: a typo, not a shorter list)."""
    raw = [str(t) for t in text] if isinstance(text, (list, tuple)) else str(text).split(",")
    items = [t.strip() for t in raw]
    if not any(items):
        raise ValueError(f"{option}: empty list")
    if not all(items):
        raise ValueError(f"{option} {excerpt(text)}: an empty item in the list")
    return items


def refuse_set_keys(overrides, owners: dict[str, str], each: str) -> None:
    """A ``--set KEY=VALUE`` of a key the command sets itself for ``each`` point or variant
    (``owners``: key -> the option that sets it) is a usage error: the report would show the
    option's value while the run used the override."""
    from train.errors import ConfigError

    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if key in owners:
            hint = "; use that option" if owners[key].startswith("--") else ""
            raise ConfigError(f"--set {excerpt(key)}: set by {owners[key]} for every {each}{hint}")


def choice_list(text: str, option: str, choices, word: str = "known") -> list[str]:
    """``a,b`` -> ``["a", "b"]``; ValueError (a usage error) when empty or an item is not a choice."""
    items = comma_list(text, option)
    for item in items:
        if item not in choices:
            raise ValueError(f"{option}: unknown {item!r} ({word}: {', '.join(choices)})")
    return items


def have_matplotlib() -> bool:
    """Charts are optional: a machine without matplotlib still gets JSON and Markdown."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        log.warning("matplotlib is not installed: no PNG chart")
        return False
    return True


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if v != v:  # NaN
            return "nan"
        return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
    return "" if v is None else str(v)


def markdown_table(rows: Sequence[dict], columns: Sequence[str]) -> str:
    head = "| " + " | ".join(columns) + " |"
    sep = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(_fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join([head, sep, *body])


NAME_MAX = 100  # characters of a report name
_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{NAME_MAX - 1}}}", re.ASCII)


def check_report(out_dir, name: str) -> Path:
    """Before any work: ``--name`` is a plain file name (no path, no '..', no option) and
    ``--out`` can hold NAME.json/.md/.png (regular files only: never a FIFO or symlink)."""
    from train.errors import ConfigError
    from train.preflight import check_out_dir

    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise ConfigError(f"--name {excerpt(name)}: a report name is letters, digits, '.', '_' and '-' "
                          f"(no path), at most {NAME_MAX} characters")
    out = check_out_dir(out_dir)
    for suffix in REPORT_SUFFIXES:
        if (out / f"{name}{suffix}").exists() or (out / f"{name}{suffix}").is_symlink():
            check_output_target(out / f"{name}{suffix}", "--out/--name")
    return out


def claim_report(out_dir: Path, name: str) -> None:
    """After the arguments are checked, before the work: the writer of the report (rank 0)
    claims ``OUT/NAME.*`` for the life of the process (see :func:`_claim`)."""
    if int(os.environ.get("RANK") or "0") == 0:
        _claim(Path(out_dir), name)


REPORT_SUFFIXES = (".json", ".md", ".png")
_claims: dict[tuple[str, str], list] = {}  # (out, name) -> [RunLock, earlier report moved aside yet]


def _claim(out: Path, name: str) -> list:
    """One bench at a time writes ``OUT/NAME.*``: the writer (rank 0) holds
    ``OUT/.NAME.report.lock`` until it exits; a second bench with the same --out/--name is
    refused (one line, exit 2) instead of interleaving its files with the first's."""
    from train.rundir import RunLock

    key = (os.path.realpath(out), name)
    if key not in _claims:
        out.mkdir(parents=True, exist_ok=True)
        lock = RunLock(out, f".{name}.report.lock", label=f"--out/--name {excerpt_path(out / name)}")
        lock.acquire()
        if not _claims:
            atexit.register(lambda: [claim[0].release() for claim in _claims.values()])
        _claims[key] = [lock, False]
    return _claims[key]


def _keep_earlier(out: Path, name: str) -> None:
    """Before this bench's first report: an earlier bench's NAME.json/.md/.png move
    together into ``OUT/replaced-<time>/`` (kept, never overwritten)."""
    from train.rundir import move_aside

    claim = _claim(out, name)
    if claim[1]:
        return
    earlier = [f"{name}{suffix}" for suffix in REPORT_SUFFIXES if os.path.lexists(out / f"{name}{suffix}")]
    if earlier:
        aside = move_aside(out, earlier, f"--out/--name {excerpt_path(out / name)}")
        log.info("the earlier report %s.* is kept in %s", name, aside)
    claim[1] = True


def write_report(out_dir: Path, name: str, rows: list[dict], columns: Sequence[str],
                 meta: dict | None = None, chart=None) -> str:
    """Write JSON + Markdown (+ PNG when ``chart(ax, rows)`` is given and matplotlib is
    installed); return the table.

    ``meta`` records how the numbers were made (command, GPU, versions)."""
    out_dir = check_report(out_dir, name)
    _keep_earlier(out_dir, name)
    table = markdown_table(rows, columns)
    atomic_write(out_dir / f"{name}.json", json.dumps({"meta": meta or {}, "rows": rows}, indent=1), what="--out")
    header = "".join(f"- {k}: {v}\n" for k, v in (meta or {}).items())
    atomic_write(out_dir / f"{name}.md", header + "\n" + table + "\n", what="--out")
    if chart is not None and have_matplotlib():
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(9, 5))
        chart(ax, rows)
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        png = io.BytesIO()
        fig.savefig(png, dpi=110, format="png")
        plt.close(fig)
        atomic_write(out_dir / f"{name}.png", png.getvalue(), what="--out")
    return table


def environment_meta() -> dict:
    """Versions and devices, recorded next to every benchmark result."""
    import platform

    import torch

    meta = {"torch": torch.__version__, "python": platform.python_version(), "host": platform.node()}
    if torch.cuda.is_available():
        meta["gpu"] = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
        meta["cuda"] = torch.version.cuda
        meta["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    else:
        meta["gpu"] = "none (CPU)"
    try:
        import torchao

        meta["torchao"] = torchao.__version__
    except ImportError:
        pass
    return meta
