"""Benchmark output shared by every ``train bench`` command: a printed Markdown table,
``NAME.json`` (all rows), ``NAME.md`` (the table) and ``NAME.png`` (a chart)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence


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


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_report(out_dir: Path, name: str, rows: list[dict], columns: Sequence[str],
                 meta: dict | None = None, chart=None) -> str:
    """Write JSON + Markdown (+ PNG when ``chart(ax, rows)`` is given); return the table.

    ``meta`` records how the numbers were made (command, GPU, versions)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    table = markdown_table(rows, columns)
    _atomic_write(out_dir / f"{name}.json", json.dumps({"meta": meta or {}, "rows": rows}, indent=1).encode())
    header = "".join(f"- {k}: {v}\n" for k, v in (meta or {}).items())
    _atomic_write(out_dir / f"{name}.md", (header + "\n" + table + "\n").encode())
    if chart is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(9, 5))
        chart(ax, rows)
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        tmp = out_dir / f".{name}.png.tmp.png"
        fig.savefig(tmp, dpi=110)
        plt.close(fig)
        os.replace(tmp, out_dir / f"{name}.png")
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
