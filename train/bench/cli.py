"""``train bench``: benchmark commands (each prints a table and writes JSON, Markdown, PNG)."""

from __future__ import annotations

import click


@click.group("bench")
def bench() -> None:
    """Measure step throughput, collectives and gradient compression."""
