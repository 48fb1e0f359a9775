"""One unit of ``train data prepare`` -> one part file: read its documents, encode them with
the fast tokenizer this worker process loaded, append EOS, write the part atomically."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np

from core.safety import atomic_write, parse_json
from train.errors import PrepareError
from train.prepare.units import Unit

BATCH_CHARS = 1 << 20  # characters handed to encode_batch at once

_worker_tok = None


def init_worker(tok_json: str) -> None:
    """Load the serialised tokenizer once per worker process (the pool's initializer)."""
    global _worker_tok
    from tokenizers import Tokenizer

    _worker_tok = Tokenizer.from_str(tok_json)


def _texts(unit: Unit, field: str):
    """Batches of documents of ``unit`` (lists of str)."""
    if unit.kind in ("text", "jsonl"):
        with _reading(unit, f"bytes {unit.start}..{unit.stop}"), open(unit.path, "rb") as fh:
            fh.seek(unit.start)
            blob = fh.read(unit.stop - unit.start)
        if unit.kind == "text":
            yield _text_pieces(blob)
        else:
            yield from _jsonl_batches(blob, unit, field)
        return
    docs = [d for d in _column(unit, field).to_pylist() if d]
    for i in range(0, len(docs), 1024):
        yield docs[i:i + 1024]


def _text_pieces(blob: bytes) -> list[str]:
    """One document, cut at newlines into pieces encode_batch can spread over threads."""
    text = blob.decode("utf-8", errors="replace")
    pieces, pos = [], 0
    while pos < len(text):
        end = text.find("\n", pos + BATCH_CHARS)
        end = len(text) if end < 0 else end + 1
        pieces.append(text[pos:end])
        pos = end
    return pieces


def _jsonl_batches(blob: bytes, unit: Unit, field: str):
    """The ``field`` strings of a JSONL byte range, in batches of about BATCH_CHARS."""
    batch, chars = [], 0
    for lineno, line in enumerate(blob.splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = parse_json(line)[field]
        except (ValueError, TypeError, KeyError, IndexError):
            raise PrepareError(f"input {unit.path}: line {lineno} after byte {unit.start} is not a JSON object "
                               f"with a string {field!r} field (--text-field)") from None
        if not isinstance(doc, str):
            raise PrepareError(f"input {unit.path}: line {lineno} after byte {unit.start}: field {field!r} "
                               f"is {type(doc).__name__}, not a string")
        if not doc.isascii():  # a lone surrogate (\ud800) is valid JSON, not UTF-8: replaced, as in text files
            doc = doc.encode("utf-8", "replace").decode("utf-8")
        batch.append(doc)
        chars += len(doc)
        if chars >= BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _column(unit: Unit, field: str):
    """The ``field`` column of a Parquet row group or of an Arrow file's row range: strings."""
    import pyarrow as pa

    column = _raw_column(unit, field)
    string_view = getattr(pa.types, "is_string_view", lambda t: False)
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type) or string_view(column.type)):
        raise PrepareError(f"input {unit.path}: column {field!r} holds {column.type}, not strings (--text-field)")
    return column


@contextlib.contextmanager
def _reading(unit: Unit, what: str):
    """A read error of an input (a corrupted page, an I/O error) names the input and the part
    read, as a PrepareError (exit 2), instead of passing for an error of --out."""
    try:
        import pyarrow as pa

        errors: tuple = (OSError, pa.ArrowException)
    except ImportError:  # text and JSONL need no pyarrow
        errors = (OSError,)
    try:
        yield
    except errors as exc:
        detail = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise PrepareError(f"input {unit.path}: {what} cannot be read ({type(exc).__name__}: {detail})") from None


def _raw_column(unit: Unit, field: str):
    if unit.kind == "parquet":
        import pyarrow.parquet as pq

        with _reading(unit, f"row group {unit.start}"):
            pf = pq.ParquetFile(unit.path)
            if field not in pf.schema_arrow.names:
                raise PrepareError(f"input {unit.path}: no column {field!r} (columns: "
                                   f"{', '.join(pf.schema_arrow.names)}; --text-field)")
            return pf.read_row_group(unit.start, columns=[field]).column(0)
    import pyarrow as pa

    with _reading(unit, "its record batches"), pa.memory_map(unit.path, "r") as src:
        table = pa.ipc.open_stream(src).read_all()
    if field not in table.column_names:
        raise PrepareError(f"input {unit.path}: no column {field!r} (columns: {', '.join(table.column_names)}; "
                           "--text-field)")
    return table.column(field).slice(unit.start, unit.stop - unit.start)


def _ids(encoding, dtype: str, vocab_size: int, unit: Unit) -> np.ndarray:
    """One encoding's ids as ``dtype``; an id the vocabulary (and so the dtype and a later
    ``train run``) does not hold is refused, naming the tokenizer, never wrapped around."""
    ids = np.asarray(encoding.ids, dtype=np.int64)
    if ids.size and (int(ids.max()) >= vocab_size or int(ids.min()) < 0):
        bad = int(ids.max()) if int(ids.max()) >= vocab_size else int(ids.min())
        raise PrepareError(f"--tokenizer: produced token id {bad} for input {unit.path}, outside its vocabulary "
                           f"0..{vocab_size - 1} (a post-processor's special token?)")
    return ids.astype(dtype)


def tokenize_unit(unit: Unit, field: str, eos_id: int | None, dtype: str, vocab_size: int,
                  part: str) -> tuple[int, int]:
    """Tokenize one unit into ``part`` (atomically); returns (tokens, documents)."""
    tok = _worker_tok
    arrays, docs = [], 0
    eos = [] if eos_id is None else [np.asarray([eos_id], dtype=dtype)]
    for batch in _texts(unit, field):
        try:
            encoded = tok.encode_batch(batch, add_special_tokens=True)
        except Exception as exc:  # noqa: BLE001 - the tokenizers library raises a bare Exception
            raise PrepareError(f"--tokenizer: cannot encode input {unit.path} "
                               f"({' '.join(str(exc).split())[:200]})") from None
        if unit.kind == "text":  # pieces of one document
            arrays += [_ids(e, dtype, vocab_size, unit) for e in encoded]
            if unit.last:
                docs += 1
                arrays += eos
            continue
        for e in encoded:
            arrays.append(_ids(e, dtype, vocab_size, unit))
            arrays += eos
        docs += len(encoded)
    tokens = np.concatenate(arrays) if arrays else np.zeros(0, dtype=dtype)
    # Temp + rename (core.safety.atomic_write): a file or link placed at either name is replaced, never
    # followed. No fsync per part (two per part are slow on network file systems); the merged file is fsynced.
    atomic_write(part, np.ascontiguousarray(tokens), what="part file", durable=False)
    atomic_write(Path(part).with_suffix(".json"), json.dumps(
        {"key": unit.key(), "num_tokens": int(tokens.size), "documents": docs}), what="part file", durable=False)
    return int(tokens.size), docs
