"""``train data prepare``: text -> the token file that ``data.source=file`` reads.

Inputs (any mix, each argument one of):

* plain text (``.txt``, ``.md``, ``.text``): one document per file;
* JSON Lines (``.jsonl``, ``.ndjson``): one document per line, text in ``--text-field``;
* Parquet (``.parquet``): one document per row, column ``--text-field``;
* a ``datasets`` dataset saved with ``save_to_disk`` (a directory), or ``.arrow`` files;
* ``hf:NAME[:CONFIG]``: a Hugging Face dataset already in the local HF cache
  (``datasets.load_dataset``; ``--online`` lets it download);
* a directory of the file types above (searched recursively).

The tokenizer (``--tokenizer``) is a ``tokenizer.json`` file, a directory holding one
(any saved Hugging Face tokenizer), or a Hub name (``gpt2``, ``meta-llama/...``) resolved
with ``transformers.AutoTokenizer`` when installed, else ``huggingface_hub``: from the
local cache unless ``--online``. Encoding runs in the fast (Rust) ``tokenizers`` backend.

Work is cut into units (a byte range of a text/JSONL file, a Parquet row group, a row
range of an Arrow file) and spread over ``--workers`` processes. Each unit's tokens go
to ``OUT.parts/part-NNNNNN.bin`` (written under a temporary name, then renamed): an
interrupted run resumes where it stopped, and ``--shard I/N`` lets N machines split the
units of one plan. A run without ``--shard`` finally concatenates the parts in plan order
(the output does not depend on the worker count) into ``OUT`` and writes ``OUT.json``:
dtype, vocab_size, num_tokens, documents, eos_id and the tokenizer's name and sha256.

Every document is followed by the EOS token (``--eos``, else the tokenizer's own) so
documents do not run into each other in the token stream.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import click
import numpy as np

from train.errors import PrepareError

log = logging.getLogger("train.prepare")

TEXT_SUFFIXES = {".txt", ".md", ".text"}
JSONL_SUFFIXES = {".jsonl", ".ndjson"}
CHUNK_BYTES = 16 << 20  # text/JSONL unit size
ARROW_ROWS = 20_000  # rows per unit of an Arrow file
BATCH_CHARS = 1 << 20  # characters handed to encode_batch at once
EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[SEP]")
FORMAT = "hopper-train tokens v1"



@dataclass(frozen=True)
class Unit:
    kind: str  # text | jsonl | parquet | arrow
    path: str
    start: int  # byte offset | row group | first row
    stop: int  # byte offset | row group + 1 | last row + 1
    last: bool = True  # text: the chunk that ends the file (carries the document's EOS)

    def key(self) -> str:
        return f"{self.kind}:{self.path}:{self.start}:{self.stop}"


# ----------------------------------------------------------------------------- tokenizer


@dataclass
class TokenizerSpec:
    name: str
    json: str  # the fast tokenizer, serialised (what workers load)
    sha256: str
    vocab_size: int
    eos_id: int | None


def _eos_from_config(directory: Path) -> str | None:
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        f = directory / name
        if f.is_file():
            try:
                eos = json.loads(f.read_text()).get("eos_token")
            except (ValueError, AttributeError):
                continue
            if isinstance(eos, dict):
                eos = eos.get("content")
            if isinstance(eos, str):
                return eos
    return None


def load_tokenizer(name: str, online: bool = False, eos: str | None = None) -> TokenizerSpec:
    """Resolve ``name`` to a fast tokenizer; raises PrepareError naming it."""
    from tokenizers import Tokenizer

    path = Path(name)
    eos_text = None
    if path.is_file():
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # noqa: BLE001 - any parse failure is the file's fault
            raise PrepareError(f"--tokenizer {name}: not a tokenizer.json file ({exc})") from None
        eos_text = _eos_from_config(path.parent)
    elif path.is_dir() and (path / "tokenizer.json").is_file():
        tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        eos_text = _eos_from_config(path)
    else:
        tok, eos_text = _hub_tokenizer(name, online)
    eos_text = eos or eos_text
    eos_id = None
    if eos_text is not None:
        eos_id = tok.token_to_id(eos_text)
        if eos_id is None:
            raise PrepareError(f"--eos {eos_text!r}: not a token of tokenizer {name}")
    else:
        eos_id = next((tok.token_to_id(t) for t in EOS_NAMES if tok.token_to_id(t) is not None), None)
    text = tok.to_str()
    return TokenizerSpec(name, text, hashlib.sha256(text.encode()).hexdigest(),
                         tok.get_vocab_size(with_added_tokens=True), eos_id)


def _hub_tokenizer(name: str, online: bool):
    """A Hub name, via transformers.AutoTokenizer when installed, else huggingface_hub."""
    where = "the Hugging Face cache" if not online else "the Hugging Face Hub"
    hint = "" if online else " (offline by default: pass --online to download it)"
    if os.sep in name and not Path(name).exists() and name.startswith((".", "/")):
        raise PrepareError(f"--tokenizer {name}: no such file or directory")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        AutoTokenizer = None  # noqa: N806
    if AutoTokenizer is not None:
        try:
            hf = AutoTokenizer.from_pretrained(name, local_files_only=not online)
        except Exception as exc:  # noqa: BLE001 - transformers raises OSError/ValueError/...
            raise PrepareError(f"--tokenizer {name}: not found in {where}{hint} ({type(exc).__name__})") from None
        backend = getattr(hf, "backend_tokenizer", None)
        if backend is None:
            raise PrepareError(f"--tokenizer {name}: has no fast (Rust) tokenizer; save it with tokenizer.json")
        return backend, hf.eos_token
    try:
        from huggingface_hub import hf_hub_download
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise PrepareError(f"--tokenizer {name}: not a local file; Hub names need huggingface_hub ({exc})") from None
    try:
        file = hf_hub_download(name, "tokenizer.json", local_files_only=not online)
    except Exception as exc:  # noqa: BLE001
        raise PrepareError(f"--tokenizer {name}: not found in {where}{hint} ({type(exc).__name__})") from None
    return Tokenizer.from_file(file), _eos_from_config(Path(file).parent)


# ----------------------------------------------------------------------------- planning


def _line_chunks(path: Path, kind: str) -> list[Unit]:
    """Byte ranges of about CHUNK_BYTES, each ending after a newline."""
    size = path.stat().st_size
    units, start = [], 0
    with open(path, "rb") as fh:
        while start < size:
            stop = min(start + CHUNK_BYTES, size)
            if stop < size:
                fh.seek(stop)
                rest = fh.readline()
                stop += len(rest)
            units.append(Unit(kind, str(path), start, stop, last=stop >= size))
            start = stop
    if not units:  # an empty file is still one (empty) document source
        units.append(Unit(kind, str(path), 0, 0))
    return units


def _arrow_units(files: list[str]) -> list[Unit]:
    import pyarrow as pa

    units = []
    for f in files:
        with pa.memory_map(f, "r") as src:
            rows = pa.ipc.open_stream(src).read_all().num_rows
        for start in range(0, rows, ARROW_ROWS):
            units.append(Unit("arrow", f, start, min(start + ARROW_ROWS, rows)))
    return units


def _dataset_files(ds, what: str, split: str | None) -> list[str]:
    import datasets

    if isinstance(ds, datasets.DatasetDict):
        if split is None:
            if len(ds) != 1:
                raise PrepareError(f"{what}: has splits {', '.join(ds)}; choose one with --split")
            split = next(iter(ds))
        if split not in ds:
            raise PrepareError(f"{what}: has no split {split!r} (splits: {', '.join(ds)})")
        ds = ds[split]
    files = [c["filename"] for c in ds.cache_files]
    if not files:
        raise PrepareError(f"{what}: is an in-memory dataset without Arrow files on disk")
    if ds._indices is not None:  # noqa: SLF001 - a shuffled/selected view: the files hold other rows
        raise PrepareError(f"{what}: is a filtered/shuffled view; save it with flatten_indices() first")
    return files


def plan_units(inputs: list[str], split: str | None, online: bool) -> list[Unit]:
    units: list[Unit] = []
    for item in inputs:
        if item.startswith("hf:"):
            units += _arrow_units(_hub_dataset(item, split, online))
            continue
        path = Path(item)
        if not path.exists():
            raise PrepareError(f"input {item}: no such file or directory")
        if path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file()):
            import datasets

            try:
                ds = datasets.load_from_disk(str(path))
            except Exception as exc:  # noqa: BLE001
                raise PrepareError(f"input {item}: not a readable datasets directory ({type(exc).__name__}: {exc})") from None
            units += _arrow_units(_dataset_files(ds, f"input {item}", split))
            continue
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        found = 0
        for f in files:
            suffix = f.suffix.lower()
            if suffix in TEXT_SUFFIXES:
                units += _line_chunks(f, "text")
            elif suffix in JSONL_SUFFIXES:
                units += _line_chunks(f, "jsonl")
            elif suffix == ".parquet":
                import pyarrow.parquet as pq

                try:
                    groups = pq.ParquetFile(f).num_row_groups
                except Exception as exc:  # noqa: BLE001
                    raise PrepareError(f"input {f}: not a readable Parquet file ({type(exc).__name__})") from None
                units += [Unit("parquet", str(f), g, g + 1) for g in range(groups)]
            elif suffix == ".arrow":
                units += _arrow_units([str(f)])
            elif not path.is_dir():
                raise PrepareError(f"input {f}: unsupported type {suffix or '(no suffix)'} (use .txt, .md, .jsonl, "
                                   ".parquet, .arrow, a datasets directory or hf:NAME)")
            else:
                continue
            found += 1
        if path.is_dir() and not found:
            raise PrepareError(f"input {item}: directory holds no .txt/.md/.jsonl/.parquet/.arrow file")
    return units


def _hub_dataset(item: str, split: str | None, online: bool) -> list[str]:
    import datasets

    name, _, config = item[3:].partition(":")
    if not online:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        ds = datasets.load_dataset(name, config or None, split=split)
    except Exception as exc:  # noqa: BLE001
        hint = "" if online else " (offline by default: pass --online to download it)"
        raise PrepareError(f"input {item}: cannot be loaded from the Hugging Face cache{hint} "
                           f"({type(exc).__name__})") from None
    return _dataset_files(ds, f"input {item}", split)


# ----------------------------------------------------------------------------- workers

_worker_tok = None


def _init_worker(tok_json: str) -> None:
    global _worker_tok
    from tokenizers import Tokenizer

    _worker_tok = Tokenizer.from_str(tok_json)


def _texts(unit: Unit, field: str):
    """Batches of documents of ``unit`` (lists of str)."""
    if unit.kind in ("text", "jsonl"):
        with open(unit.path, "rb") as fh:
            fh.seek(unit.start)
            blob = fh.read(unit.stop - unit.start)
        if unit.kind == "text":
            text = blob.decode("utf-8", errors="replace")
            # One document, cut at newlines into pieces encode_batch can spread over threads.
            pieces, pos = [], 0
            while pos < len(text):
                end = text.find("\n", pos + BATCH_CHARS)
                end = len(text) if end < 0 else end + 1
                pieces.append(text[pos:end])
                pos = end
            yield pieces
            return
        batch, chars = [], 0
        for lineno, line in enumerate(blob.splitlines(), 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)[field]
            except (ValueError, TypeError, KeyError, IndexError):
                raise PrepareError(f"input {unit.path}: line {lineno} after byte {unit.start} is not a JSON object "
                                   f"with a string {field!r} field (--text-field)") from None
            if not isinstance(doc, str):
                raise PrepareError(f"input {unit.path}: line {lineno} after byte {unit.start}: field {field!r} "
                                   f"is {type(doc).__name__}, not a string")
            batch.append(doc)
            chars += len(doc)
            if chars >= BATCH_CHARS:
                yield batch
                batch, chars = [], 0
        if batch:
            yield batch
        return
    if unit.kind == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(unit.path)
        if field not in pf.schema_arrow.names:
            raise PrepareError(f"input {unit.path}: no column {field!r} (columns: {', '.join(pf.schema_arrow.names)}; "
                               "--text-field)")
        column = pf.read_row_group(unit.start, columns=[field]).column(0)
    else:
        import pyarrow as pa

        with pa.memory_map(unit.path, "r") as src:
            table = pa.ipc.open_stream(src).read_all()
        if field not in table.column_names:
            raise PrepareError(f"input {unit.path}: no column {field!r} (columns: {', '.join(table.column_names)}; "
                               "--text-field)")
        column = table.column(field).slice(unit.start, unit.stop - unit.start)
    docs = [d for d in column.to_pylist() if d]
    for i in range(0, len(docs), 1024):
        yield docs[i:i + 1024]


def tokenize_unit(unit: Unit, field: str, eos_id: int | None, dtype: str, part: str) -> tuple[int, int]:
    """Tokenize one unit into ``part`` (atomically); returns (tokens, documents)."""
    tok = _worker_tok
    arrays, docs = [], 0
    for batch in _texts(unit, field):
        encoded = tok.encode_batch(batch, add_special_tokens=True)
        if unit.kind == "text":  # pieces of one document
            arrays += [np.asarray(e.ids, dtype=dtype) for e in encoded]
            if unit.last:
                docs += 1
                if eos_id is not None:
                    arrays.append(np.asarray([eos_id], dtype=dtype))
            continue
        for e in encoded:
            arrays.append(np.asarray(e.ids, dtype=dtype))
            if eos_id is not None:
                arrays.append(np.asarray([eos_id], dtype=dtype))
        docs += len(encoded)
    tokens = np.concatenate(arrays) if arrays else np.zeros(0, dtype=dtype)
    tmp = f"{part}.tmp{os.getpid()}"
    tokens.tofile(tmp)
    os.replace(tmp, part)
    Path(part).with_suffix(".json").write_text(json.dumps({"key": unit.key(), "num_tokens": int(tokens.size),
                                                           "documents": docs}))
    return int(tokens.size), docs


# ----------------------------------------------------------------------------- driver


@dataclass
class Result:
    out: Path
    num_tokens: int
    documents: int
    units: int
    done_before: int  # units found finished from an earlier run
    seconds: float
    merged: bool

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.seconds if self.seconds else 0.0


def _part(parts: Path, i: int) -> Path:
    return parts / f"part-{i:06d}.bin"


def _finished(parts: Path, i: int, unit: Unit, itemsize: int) -> tuple[int, int] | None:
    meta = _part(parts, i).with_suffix(".json")
    try:
        info = json.loads(meta.read_text())
        if info["key"] != unit.key() or _part(parts, i).stat().st_size != info["num_tokens"] * itemsize:
            return None
        return int(info["num_tokens"]), int(info["documents"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def prepare(inputs: list[str], out: Path, tokenizer: str, *, workers: int = 0, text_field: str = "text",
            split: str | None = None, shard: tuple[int, int] | None = None, eos: str | None = None,
            online: bool = False, keep_parts: bool = False, progress: bool = True) -> Result:
    t0 = time.perf_counter()
    if out.suffix == ".json":
        raise PrepareError(f"--out {out}: the metadata goes beside the token file as .json; name the token file .bin")
    meta_path = out.with_suffix(".json")
    spec = load_tokenizer(tokenizer, online, eos)
    dtype = "uint16" if spec.vocab_size <= 65536 else "uint32"
    itemsize = np.dtype(dtype).itemsize
    sources = sorted(inputs)
    if out.exists() or meta_path.exists():
        try:
            old = json.loads(meta_path.read_text())
            same = old.get("tokenizer", {}).get("sha256") == spec.sha256 and old.get("sources") == sources
        except (OSError, ValueError, AttributeError):
            same = False
        if same and out.is_file() and out.stat().st_size == int(old["num_tokens"]) * itemsize:
            log.info("%s is already prepared from these inputs with this tokenizer; nothing to do", out)
            return Result(out, int(old["num_tokens"]), int(old.get("documents", 0)), 0, 0, 0.0, True)
        raise PrepareError(f"--out {out}: exists and was not prepared from these inputs with this tokenizer; "
                           "choose another --out or remove it")
    units = plan_units(inputs, split, online)
    if not units:
        raise PrepareError("no input documents found")
    parts = out.with_name(out.name + ".parts")
    plan = {"format": FORMAT, "tokenizer": {"name": spec.name, "sha256": spec.sha256}, "eos_id": spec.eos_id,
            "text_field": text_field, "dtype": dtype, "units": [asdict(u) for u in units]}
    plan_file = parts / "plan.json"
    if plan_file.is_file():
        try:
            old_plan = json.loads(plan_file.read_text())
        except ValueError:
            old_plan = None
        if old_plan != plan:
            raise PrepareError(f"{parts}: holds an unfinished preparation of other inputs or with another tokenizer "
                               "or options; remove it or choose another --out")
    else:
        parts.mkdir(parents=True, exist_ok=True)
        tmp = plan_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(plan))
        os.replace(tmp, plan_file)

    mine = [i for i in range(len(units)) if shard is None or i % shard[1] == shard[0]]
    done = {i: r for i in mine if (r := _finished(parts, i, units[i], itemsize)) is not None}
    todo = [i for i in mine if i not in done]
    if done:
        log.info("resuming: %d of %d units already tokenized in %s", len(done), len(mine), parts)
    workers = max(1, min(workers or os.cpu_count() or 1, len(todo)))
    log.info("tokenizing %d units with %d worker(s); tokenizer %s (vocab %d, sha256 %s, eos id %s)",
             len(todo), workers, spec.name, spec.vocab_size, spec.sha256[:12], spec.eos_id)
    results = dict(done)
    with _ProgressBar(progress, len(mine), len(done)) as bar:
        if workers == 1:
            _init_worker(spec.json)
            for i in todo:
                results[i] = tokenize_unit(units[i], text_field, spec.eos_id, dtype, str(_part(parts, i)))
                bar.advance(results[i][0])
        else:
            env_before = os.environ.get("TOKENIZERS_PARALLELISM")
            os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker process: no oversubscription
            try:
                ctx = multiprocessing.get_context("spawn")
                with cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                            initargs=(spec.json,)) as pool:
                    futures = {pool.submit(tokenize_unit, units[i], text_field, spec.eos_id, dtype,
                                           str(_part(parts, i))): i for i in todo}
                    try:
                        for fut in cf.as_completed(futures):
                            results[futures[fut]] = fut.result()
                            bar.advance(results[futures[fut]][0])
                    except BaseException:
                        for f in futures:
                            f.cancel()
                        raise
            finally:
                if env_before is None:
                    os.environ.pop("TOKENIZERS_PARALLELISM", None)
                else:
                    os.environ["TOKENIZERS_PARALLELISM"] = env_before
    num_tokens = sum(r[0] for r in results.values())
    documents = sum(r[1] for r in results.values())
    if shard is not None:
        return Result(out, num_tokens, documents, len(mine), len(done), time.perf_counter() - t0, False)

    # Merge: token file first (renamed into place), metadata last: the .json is the commit point.
    if num_tokens > (np.iinfo(np.uint32).max if dtype == "uint32" else 1 << 62):
        raise PrepareError("too many tokens for one file")
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as dst:
        for i in range(len(units)):
            with open(_part(parts, i), "rb") as src:
                shutil.copyfileobj(src, dst, 16 << 20)
        dst.flush()
        os.fsync(dst.fileno())
    if tmp.stat().st_size != num_tokens * itemsize:
        raise RuntimeError(f"merged {tmp}: {tmp.stat().st_size} bytes, expected {num_tokens * itemsize}")
    os.replace(tmp, out)
    meta = {"format": FORMAT, "dtype": dtype, "vocab_size": spec.vocab_size, "num_tokens": num_tokens,
            "documents": documents, "eos_id": spec.eos_id,
            "tokenizer": {"name": spec.name, "sha256": spec.sha256}, "sources": sources, "text_field": text_field}
    tmp_meta = meta_path.with_name(f".{meta_path.name}.tmp{os.getpid()}")
    tmp_meta.write_text(json.dumps(meta, indent=1))
    os.replace(tmp_meta, meta_path)
    if not keep_parts:
        shutil.rmtree(parts, ignore_errors=True)
    return Result(out, num_tokens, documents, len(units), len(done), time.perf_counter() - t0, True)


class _ProgressBar:
    """rich progress on a terminal; a log line every ~10% of the units otherwise."""

    def __init__(self, enabled: bool, total: int, done: int):
        self.total, self.done, self.tokens = total, done, 0
        self.bar = None
        self.next_log = done
        if enabled and sys.stderr.isatty():
            try:
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    TextColumn,
                    TimeRemainingColumn,
                )
            except ImportError:
                return
            self.bar = Progress(TextColumn("prepare"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[tokens]} tokens"), TimeRemainingColumn(),
                                console=Console(stderr=True), transient=True)
            self.task = self.bar.add_task("prepare", total=total, completed=done, tokens=0)

    def __enter__(self):
        if self.bar:
            self.bar.start()
        return self

    def __exit__(self, *exc):
        if self.bar:
            self.bar.stop()

    def advance(self, tokens: int) -> None:
        self.done += 1
        self.tokens += tokens
        if self.bar:
            self.bar.update(self.task, completed=self.done, tokens=f"{self.tokens:,}")
        elif self.done >= self.next_log or self.done == self.total:
            log.info("%d/%d units, %s tokens", self.done, self.total, f"{self.tokens:,}")
            self.next_log = self.done + max(1, self.total // 10)


# ----------------------------------------------------------------------------- CLI


def _parse_shard(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    try:
        i, n = (int(x) for x in value.split("/"))
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected I/N, e.g. 0/4") from None
    if not (n >= 1 and 0 <= i < n):
        raise click.BadParameter(f"{value!r}: needs 0 <= I < N")
    return i, n


@click.group("data")
def data() -> None:
    """Prepare training data."""


@data.command("prepare")
@click.argument("inputs", nargs=-1, required=True)
@click.option("--tokenizer", required=True,
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
    from train.console import fail

    logging.basicConfig(level=logging.INFO, format="[prepare] %(message)s", stream=sys.stderr)
    try:
        res = prepare(list(inputs), out, tokenizer, workers=workers, text_field=text_field, split=split,
                      shard=_parse_shard(shard), eos=eos, online=online, keep_parts=keep_parts)
    except click.BadParameter as exc:
        fail(f"--shard {exc.message}", 2)
    except PrepareError as exc:
        fail(str(exc), 2)
    except ImportError as exc:
        fail(f"{exc.name or exc}: not installed (pip install 'hopper-train[data]')", 2)
    fresh = res.num_tokens if not res.done_before else None
    rate = f", {res.tokens_per_s:,.0f} tokens/s" if fresh and res.seconds else ""
    if res.merged:
        click.echo(f"{res.out}: {res.num_tokens:,} tokens, {res.documents:,} documents "
                   f"({res.units} units, {res.done_before} resumed) in {res.seconds:.1f}s{rate}")
    else:
        click.echo(f"shard done: {res.units} units, {res.num_tokens:,} tokens in {res.seconds:.1f}s{rate}; "
                   f"run again without --shard to merge into {res.out}")
