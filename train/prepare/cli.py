"""``train data``: the command group, and ``train data prepare``'s options and output."""

from __future__ import annotations

import re
from pathlib import Path

import click

from core.clicktypes import LocalPath
from core.safety import excerpt, excerpt_path
from train.console import fail, setup
from train.errors import PrepareError

MAX_SHARDS = 1_000_000


def _parse_shard(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    match = re.fullmatch(r"([0-9]{1,7})/([0-9]{1,7})", value)  # ASCII digits: int() also reads '٣'
    if not match:
        raise click.BadParameter(f"{excerpt(value)}: expected I/N in ASCII digits, e.g. 0/4")
    i, n = int(match.group(1)), int(match.group(2))
    if not (1 <= n <= MAX_SHARDS and 0 <= i < n):
        raise click.BadParameter(f"{excerpt(value)}: needs 0 <= I < N <= {MAX_SHARDS}")
    return i, n


def _check_not_empty(tokenizer: str, text_field: str, split: str | None, eos: str | None) -> None:
    """An empty value is a mistake, never "the default" (--eos '' used to mean the tokenizer's EOS)."""
    for option, value in (("--tokenizer", tokenizer), ("--text-field", text_field), ("--split", split),
                          ("--eos", eos)):
        if value is not None and not (value if option == "--eos" else value.strip()):  # ' ' may be a token
            fail(f"{option} is empty", 2)


def _culprit(filename, out: Path) -> str:
    """``--out OUT`` for an error in a file written there (OUT, OUT.json, OUT.parts/...), else the
    file itself: an input's read error is not the output's fault."""
    if filename is None or str(filename).startswith(str(out)) or Path(str(filename)).parent == out.parent:
        return f"--out {out}"
    return f"file {excerpt_path(filename)}"


@click.group("data")
def data() -> None:
    """Prepare training data."""


@data.command("prepare")
@click.argument("inputs", nargs=-1, required=True, type=LocalPath())
@click.option("--tokenizer", required=True, type=LocalPath(),
              help="tokenizer.json, a directory with one, or a Hugging Face name (from the local cache unless --online).")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Token file to write (OUT.json beside it).")
@click.option("--workers", type=click.IntRange(min=0), default=0, show_default=True,
              help="Processes; 0 = one per CPU core (at most one per unit).")
@click.option("--text-field", default="text", show_default=True, help="JSONL key / Parquet or dataset column.")
@click.option("--split", help="Split of a DatasetDict or hf: dataset (e.g. train).")
@click.option("--shard", metavar="I/N", help="Tokenize only units I, I+N, ... (no merge); a run without it merges.")
@click.option("--eos", help="Token appended after every document (default: the tokenizer's EOS).")
@click.option("--online", is_flag=True, help="Allow downloads from the Hugging Face Hub (tokenizer, hf: datasets).")
@click.option("--keep-parts", is_flag=True, help="Keep OUT.parts/ after merging.")
def prepare_cmd(inputs, tokenizer, out, workers, text_field, split, shard, eos, online, keep_parts) -> None:
    """Tokenize text, JSONL, Parquet or datasets into a token file for data.source=file."""
    from train.prepare.hub import HubUnreachable
    from train.prepare.run import prepare  # numpy, tokenizers: not for --help

    setup()  # progress and resume lines on stderr (INFO)
    _check_not_empty(tokenizer, text_field, split, eos)
    try:
        res = prepare(list(inputs), out, tokenizer, workers=workers, text_field=text_field, split=split,
                      shard=_parse_shard(shard), eos=eos, online=online, keep_parts=keep_parts)
    except click.BadParameter as exc:
        fail(f"--shard {exc.message}", 2)
    except PrepareError as exc:
        fail(str(exc), 2)
    except HubUnreachable as exc:
        fail(str(exc), 1)
    except ImportError as exc:
        fail(f"{exc.name or exc}: not installed (pip install 'hopper-train[data]')", 2)
    except OSError as exc:  # a disk full, a directory removed meanwhile: one line, not a traceback
        fail(f"{_culprit(exc.filename, out)}: {exc.strerror or exc.__class__.__name__} ({exc.filename or out})", 1)
    fresh = res.num_tokens if not res.done_before else None
    rate = f", {res.tokens_per_s:,.0f} tokens/s" if fresh and res.seconds else ""
    if res.merged:
        click.echo(f"{res.out}: {res.num_tokens:,} tokens, {res.documents:,} documents "
                   f"({res.units} units, {res.done_before} resumed) in {res.seconds:.1f}s{rate}")
    else:
        click.echo(f"shard done: {res.units} units, {res.num_tokens:,} tokens in {res.seconds:.1f}s{rate}; "
                   f"run again without --shard to merge into {res.out}")
