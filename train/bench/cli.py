"""``train bench``: benchmark commands (each prints a table and writes JSON, Markdown, PNG)."""

from __future__ import annotations

import click


@click.group("bench")
def bench() -> None:
    """Measure step throughput, collectives and gradient compression."""


from train.bench.comm import comm_cmd  # noqa: E402
from train.bench.compression import compression_cmd  # noqa: E402
from train.bench.step import step_cmd  # noqa: E402

bench.add_command(comm_cmd)
bench.add_command(compression_cmd)
bench.add_command(step_cmd)
