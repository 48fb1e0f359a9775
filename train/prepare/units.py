"""The inputs of ``train data prepare`` cut into units of work: a byte range of a text/JSONL
file, a Parquet row group, a row range of an Arrow file (a saved ``datasets`` dataset or an
``hf:`` dataset from the local cache)."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from core.safety import KERNEL_TREES, excerpt, excerpt_path, file_kind, probe_path, resolved, within
from train.errors import PrepareError

TEXT_SUFFIXES = {".txt", ".md", ".text"}
JSONL_SUFFIXES = {".jsonl", ".ndjson"}


@dataclass(frozen=True)
class Unit:
    kind: str  # text | jsonl | parquet | arrow
    path: str
    start: int  # byte offset | row group | first row
    stop: int  # byte offset | row group + 1 | last row + 1
    last: bool = True  # text: the chunk that ends the file (carries the document's EOS)

    def key(self) -> str:
        return f"{self.kind}:{self.path}:{self.start}:{self.stop}"


def _line_chunks(path: Path, kind: str, chunk_bytes: int) -> list[Unit]:
    """Byte ranges of about ``chunk_bytes``, each ending after a newline."""
    size = path.stat().st_size
    units, start = [], 0
    with open(path, "rb") as fh:
        while start < size:
            stop = min(start + chunk_bytes, size)
            if stop < size:
                fh.seek(stop)
                rest = fh.readline()
                stop += len(rest)
            units.append(Unit(kind, str(path), start, stop, last=stop >= size))
            start = stop
    if not units:  # an empty file is still one (empty) document source
        units.append(Unit(kind, str(path), 0, 0))
    return units


def _arrow_units(files: list[str], arrow_rows: int) -> list[Unit]:
    import pyarrow as pa

    units = []
    for f in files:
        try:
            with pa.memory_map(f, "r") as src:
                rows = pa.ipc.open_stream(src).read_all().num_rows
        except (OSError, pa.ArrowException) as exc:
            raise PrepareError(f"input {excerpt(f)}: not a readable Arrow stream file ({type(exc).__name__})") from None
        for start in range(0, rows, arrow_rows):
            units.append(Unit("arrow", f, start, min(start + arrow_rows, rows)))
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


def check_inputs(inputs: list[str]) -> None:
    """Every local input names a regular file or a directory (checked before the tokenizer
    loads): a name too long for the file system is one line (``exists()`` raised OSError), a
    FIFO named a.txt is refused (reading it blocked forever), so are devices and sockets. An input
    given twice - by the same name or through another path to the same file or directory (``./a.txt``,
    a link, a hard link) - is refused: it would be tokenized twice."""
    given: dict = {}
    for index, item in enumerate(inputs):
        if not item.strip():  # Path('') is the current directory: never what an empty name meant
            raise PrepareError(f"input {excerpt(item)}: empty name")
        if item.startswith("hf:"):
            _once(given, ("hf", item), index, item)
            continue
        st = probe_path(item, "input")
        if st is None:
            raise PrepareError(f"input {excerpt(item)}: no such file or directory")
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            raise PrepareError(f"input {excerpt(item)}: is {file_kind(st.st_mode)}; only regular files and "
                               "directories are read")
        real = resolved(item)
        if real == "/" or within(real, (*KERNEL_TREES, "/dev")):
            raise PrepareError(f"input {excerpt(item)}: {excerpt(real)} is the root or a kernel file system, "
                               "not a corpus")
        _once(given, (st.st_dev, st.st_ino), index, item)


def _once(seen: dict, key, index: int, item: str, file: str | None = None) -> None:
    """Record ``key`` (a file's device and inode, an ``hf:`` name) as read through input number
    ``index`` (``item``); from another input it is a PrepareError naming both (``file``: the file
    inside a directory input)."""
    first_index, first = seen.setdefault(key, (index, item))
    if first_index == index:
        return
    if file is None:
        raise PrepareError(f"input {excerpt(item)}: the same input as {excerpt(first)} (given twice); give each "
                           "input once")
    raise PrepareError(f"input {excerpt(item)}: {excerpt(file)} is also read through input {excerpt(first)}; "
                       "give each file once")


def _claim(seen: dict, units: list[Unit], index: int, item: str) -> list[Unit]:
    """``units`` of files not read through another input (else a PrepareError, see :func:`_once`)."""
    for path in dict.fromkeys(u.path for u in units):
        st = os.stat(path)
        _once(seen, (st.st_dev, st.st_ino), index, item, path)
    return units


def plan_units(inputs: list[str], split: str | None, online: bool, chunk_bytes: int,
               arrow_rows: int) -> list[Unit]:
    """Every input's units, in input order (files of a directory sorted); text/JSONL cut
    into ``chunk_bytes`` ranges, Arrow files into ``arrow_rows`` rows. The local inputs were
    checked by :func:`check_inputs` first."""
    units: list[Unit] = []
    seen: dict = {}  # every file once, whichever input reaches it (a directory and a file in it)
    for index, item in enumerate(inputs):
        if item.startswith("hf:"):
            units += _claim(seen, _arrow_units(_hub_dataset(item, split, online), arrow_rows), index, item)
            continue
        path = Path(item)
        if path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file()):
            units += _claim(seen, _arrow_units(_saved_dataset(item, path, split), arrow_rows), index, item)
            continue
        try:
            files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        except OSError as exc:  # a directory that cannot be listed: it was blamed on --out (exit 1)
            raise PrepareError(f"input {excerpt(item)}: cannot list {excerpt_path(exc.filename)} "
                               f"({exc.strerror or type(exc).__name__})") from None
        found = 0
        for f in files:
            file_units = _file_units(f, chunk_bytes, arrow_rows)
            if file_units is None:
                if not path.is_dir():
                    raise PrepareError(f"input {f}: unsupported type {f.suffix.lower() or '(no suffix)'} (use .txt, "
                                       ".md, .jsonl, .parquet, .arrow, a datasets directory or hf:NAME)")
                continue
            units += _claim(seen, file_units, index, item)
            found += 1
        if path.is_dir() and not found:
            raise PrepareError(f"input {item}: directory holds no .txt/.md/.jsonl/.parquet/.arrow file")
    return units


def _file_units(f: Path, chunk_bytes: int, arrow_rows: int) -> list[Unit] | None:
    """The units of one file by its suffix; None for a type that is not an input."""
    suffix = f.suffix.lower()
    if suffix in TEXT_SUFFIXES:
        return _line_chunks(f, "text", chunk_bytes)
    if suffix in JSONL_SUFFIXES:
        return _line_chunks(f, "jsonl", chunk_bytes)
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            groups = pq.ParquetFile(f).num_row_groups
        except Exception as exc:  # noqa: BLE001
            raise PrepareError(f"input {f}: not a readable Parquet file ({type(exc).__name__})") from None
        return [Unit("parquet", str(f), g, g + 1) for g in range(groups)]
    if suffix == ".arrow":
        return _arrow_units([str(f)], arrow_rows)
    return None


def _saved_dataset(item: str, path: Path, split: str | None) -> list[str]:
    """Arrow files of a dataset saved with ``save_to_disk``."""
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:  # noqa: BLE001
        raise PrepareError(f"input {item}: not a readable datasets directory ({type(exc).__name__}: {exc})") from None
    return _dataset_files(ds, f"input {item}", split)


def _hub_dataset(item: str, split: str | None, online: bool) -> list[str]:
    import datasets

    from train.prepare.hub import HubUnreachable, network_cause, unreachable

    name, _, config = item[3:].partition(":")
    down = unreachable() if online else None
    if not online or down:  # no network: the local cache only (no half a minute of retries)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        ds = datasets.load_dataset(name, config or None, split=split)
    except Exception as exc:  # noqa: BLE001
        if down:
            raise HubUnreachable(f"input {item}: {down}; not in the local Hugging Face cache either") from None
        if online and network_cause(exc):
            raise HubUnreachable(f"input {item}: network unreachable while asking the Hugging Face Hub "
                                 f"({type(exc).__name__})") from None
        hint = "" if online else " (offline by default: pass --online to download it)"
        raise PrepareError(f"input {item}: cannot be loaded from the Hugging Face cache{hint} "
                           f"({type(exc).__name__})") from None
    return _dataset_files(ds, f"input {item}", split)
