"""``train data prepare``'s driver: plan the units, skip the finished ones (resume), tokenize
the rest over worker processes, merge the parts in plan order into OUT and write OUT.json."""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from core.errors import InputError
from core.runlayout import check_not_in_run
from core.safety import atomic_write, check_output_target, excerpt_path, parse_json, reserved_local_path
from train.errors import ConfigError, PrepareError
from train.prepare.tokenizer import load_tokenizer
from train.prepare.units import Unit, check_inputs, plan_units
from train.prepare.worker import init_worker, tokenize_unit

log = logging.getLogger(__name__)

CHUNK_BYTES = 16 << 20  # text/JSONL unit size
ARROW_ROWS = 20_000  # rows per unit of an Arrow file
FORMAT = "hopper-train tokens v1"


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
        info = parse_json(meta.read_text())
        if info["key"] != unit.key() or _part(parts, i).stat().st_size != info["num_tokens"] * itemsize:
            return None
        return int(info["num_tokens"]), int(info["documents"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def prepare(inputs: list[str], out: Path, tokenizer: str, *, workers: int = 0, text_field: str = "text",
            split: str | None = None, shard: tuple[int, int] | None = None, eos: str | None = None,
            online: bool = False, keep_parts: bool = False, progress: bool = True) -> Result:
    """Tokenize ``inputs`` into ``out`` (+ ``out.json``); with ``shard=(i, n)`` only units
    i, i+n, ... into ``out.parts/`` (no merge). Raises PrepareError naming a bad input.

    One preparation of OUT at a time (``.OUT.lock`` beside it; a shard: ``.OUT.shard-I-of-N.lock``):
    a second one is refused, naming the first (RunDirBusy) - before, the first removed
    OUT.parts/ under the second (a traceback), or a preparation of other inputs replaced
    the token file the first had just finished."""
    _check_out(out)
    check_inputs(inputs)
    from train.rundir import RunLock

    lock_name = f".{out.name}.lock" if shard is None else f".{out.name}.shard-{shard[0]}-of-{shard[1]}.lock"
    out.parent.mkdir(parents=True, exist_ok=True)
    with RunLock(out.parent, lock_name, label=f"--out {excerpt_path(out)}"):
        return _prepare(inputs, out, tokenizer, workers=workers, text_field=text_field, split=split, shard=shard,
                        eos=eos, online=online, keep_parts=keep_parts, progress=progress)


def _prepare(inputs: list[str], out: Path, tokenizer: str, *, workers, text_field, split, shard, eos, online,
             keep_parts, progress) -> Result:
    t0 = time.perf_counter()
    spec = load_tokenizer(tokenizer, online, eos)
    dtype = "uint16" if spec.vocab_size <= 65536 else "uint32"
    itemsize = np.dtype(dtype).itemsize
    sources = sorted(inputs)
    units = plan_units(inputs, split, online, CHUNK_BYTES, ARROW_ROWS)
    inputs_sha256 = _fingerprint(units)
    previous = _already_prepared(out, spec.sha256, sources, itemsize, inputs_sha256)
    if previous is not None:
        return previous
    if not units:
        raise PrepareError("no input documents found")
    parts = out.with_name(out.name + ".parts")
    _claim_parts(parts, {"format": FORMAT, "tokenizer": {"name": spec.name, "sha256": spec.sha256},
                         "eos_id": spec.eos_id, "text_field": text_field, "dtype": dtype,
                         "units": [asdict(u) for u in units]})

    mine = [i for i in range(len(units)) if shard is None or i % shard[1] == shard[0]]
    done = {i: r for i in mine if (r := _finished(parts, i, units[i], itemsize)) is not None}
    todo = [i for i in mine if i not in done]
    if done:
        log.info("resuming: %d of %d units already tokenized in %s", len(done), len(mine), parts)
    workers = max(1, min(workers or os.cpu_count() or 1, len(todo)))
    log.info("tokenizing %d units with %d worker(s); tokenizer %s (vocab %d, sha256 %s, eos id %s)",
             len(todo), workers, spec.name, spec.vocab_size, spec.sha256[:12], spec.eos_id)
    results = dict(done)
    job = (text_field, spec.eos_id, dtype, spec.vocab_size)
    with _ProgressBar(progress, len(mine), len(done)) as bar:
        for i, result in _tokenize(units, todo, parts, job, spec.json, workers):
            results[i] = result
            bar.advance(result[0])
    num_tokens = sum(r[0] for r in results.values())
    documents = sum(r[1] for r in results.values())
    if shard is not None:
        return Result(out, num_tokens, documents, len(mine), len(done), time.perf_counter() - t0, False)

    _merge(parts, len(units), out, num_tokens, dtype)
    _write_meta(out.with_suffix(".json"), {
        "format": FORMAT, "dtype": dtype, "vocab_size": spec.vocab_size, "num_tokens": num_tokens,
        "documents": documents, "eos_id": spec.eos_id, "tokenizer": {"name": spec.name, "sha256": spec.sha256},
        "sources": sources, "inputs_sha256": inputs_sha256, "text_field": text_field})
    if not keep_parts and not _shards_running(out):
        shutil.rmtree(parts, ignore_errors=True)
    return Result(out, num_tokens, documents, len(units), len(done), time.perf_counter() - t0, True)


def _shards_running(out: Path) -> bool:
    """A ``--shard`` preparation of OUT still writes into OUT.parts/: keep it."""
    from train.rundir import lock_held

    running = [p for p in out.parent.glob(f".{out.name}.shard-*.lock") if lock_held(p)]
    if running:
        log.info("%s.parts kept: a --shard preparation is still running (%s)", out, running[0].name)
    return bool(running)


def _check_out(out: Path) -> None:
    """A token file name (not ''/'.', not .json) outside the system directories (also through
    a symbolic link or ``//etc``); OUT and OUT.json, where they exist, regular files; a
    writable place to create them."""
    if out.name in ("", ".", ".."):
        raise PrepareError(f"--out {excerpt_path(out)}: give the token file's name, e.g. tokens.bin")
    if out.suffix == ".json":
        raise PrepareError(f"--out {out}: the metadata goes beside the token file as .json; name the token file .bin")
    if reserved_local_path(out):
        raise PrepareError(f"--out {excerpt_path(out)}: inside a system directory (/etc, /usr, /dev, /proc...)")
    for path in (out, out.with_suffix(".json")):
        try:
            if os.path.lexists(path):
                check_output_target(path, "--out")
            check_not_in_run(f"--out {excerpt_path(path)}", path)
        except InputError as exc:
            raise PrepareError(str(exc)) from None
    from train.preflight import check_dir

    try:  # created if missing: the nearest existing directory must take it (also on a read-only file system)
        check_dir("--out", str(out.parent))
    except ConfigError as exc:
        raise PrepareError(str(exc)) from None


def _fingerprint(units) -> str:
    """The inputs as the preparation reads them: every unit (file, byte range / row group) and
    each file's size and modification time, so an edited or added file is a different input."""
    stamps = {}
    for u in units:
        if u.path not in stamps:
            try:
                st = os.stat(u.path)
                stamps[u.path] = [st.st_size, st.st_mtime_ns]
            except OSError:  # not a local file (a Hub dataset): its units say what it is
                stamps[u.path] = None
    text = json.dumps({"units": [asdict(u) for u in units], "files": stamps}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _already_prepared(out: Path, sha256: str, sources: list[str], itemsize: int, inputs_sha256: str) -> Result | None:
    """A finished OUT from the same inputs (unchanged since) and tokenizer: nothing to do. Any
    other OUT (or OUT.json) is refused: it is never overwritten."""
    meta_path = out.with_suffix(".json")
    if not (out.exists() or meta_path.exists()):
        return None
    changed = False
    try:
        old = parse_json(meta_path.read_text())
        same = old.get("tokenizer", {}).get("sha256") == sha256 and old.get("sources") == sources
        changed = same and old.get("inputs_sha256", inputs_sha256) != inputs_sha256
    except (OSError, ValueError, AttributeError):
        same = False
    if changed:
        raise PrepareError(f"--out {out}: was prepared from these inputs, but they changed since (a file edited, "
                           "added or removed); choose another --out or remove it to prepare again")
    if same and out.is_file() and out.stat().st_size == int(old["num_tokens"]) * itemsize:
        log.info("%s is already prepared from these inputs with this tokenizer; nothing to do", out)
        return Result(out, int(old["num_tokens"]), int(old.get("documents", 0)), 0, 0, 0.0, True)
    raise PrepareError(f"--out {out}: exists and was not prepared from these inputs with this tokenizer; "
                       "choose another --out or remove it")


def _claim_parts(parts: Path, plan: dict) -> None:
    """``parts/plan.json`` records what the parts are of; a directory holding another plan is
    refused (its parts belong to other inputs or options)."""
    plan_file = parts / "plan.json"
    if os.path.islink(parts) or (os.path.lexists(parts) and not parts.is_dir()):
        raise PrepareError(f"{excerpt_path(parts)}: exists and is not a directory (a link or a file); remove it or "
                           "choose another --out")
    if parts.is_dir() and not plan_file.is_file() and any(parts.iterdir()):  # adopted, then removed at the end
        raise PrepareError(f"{excerpt_path(parts)}: holds files that are no preparation's parts (no plan.json); "
                           "remove it or choose another --out")
    if plan_file.is_file():
        try:
            old_plan = parse_json(plan_file.read_text())
        except ValueError:
            old_plan = None
        if old_plan != plan:
            raise PrepareError(f"{parts}: holds an unfinished preparation of other inputs or with another tokenizer "
                               "or options; remove it or choose another --out")
        return
    parts.mkdir(parents=True, exist_ok=True)
    atomic_write(plan_file, json.dumps(plan), what="--out")


def _tokenize(units: list[Unit], todo: list[int], parts: Path, job: tuple, tok_json: str, workers: int):
    """Yield (unit index, (tokens, documents)) as units finish: in this process when
    ``workers`` is 1, else over a pool of spawned processes."""
    if workers == 1:
        init_worker(tok_json)
        for i in todo:
            yield i, tokenize_unit(units[i], *job, str(_part(parts, i)))
        return
    env_before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker process: no oversubscription
    try:
        ctx = multiprocessing.get_context("spawn")
        with cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=init_worker,
                                    initargs=(tok_json,)) as pool:
            futures = {pool.submit(tokenize_unit, units[i], *job, str(_part(parts, i))): i for i in todo}
            try:
                for fut in cf.as_completed(futures):
                    yield futures[fut], fut.result()
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
    finally:
        if env_before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = env_before


def _merge(parts: Path, count: int, out: Path, num_tokens: int, dtype: str) -> None:
    """The parts in plan order -> ``out`` (a temporary file renamed into place)."""
    itemsize = np.dtype(dtype).itemsize
    if num_tokens > (np.iinfo(np.uint32).max if dtype == "uint32" else 1 << 62):
        raise PrepareError("too many tokens for one file")
    # a new file of a random name (O_EXCL): a link placed at a predictable temporary name is never followed
    fd, name = tempfile.mkstemp(prefix=f".{out.name[:100]}.", suffix=".tmp", dir=str(out.parent))
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as dst:
            for i in range(count):
                with open(_part(parts, i), "rb") as src:
                    shutil.copyfileobj(src, dst, 16 << 20)
            dst.flush()
            os.fsync(dst.fileno())
        if tmp.stat().st_size != num_tokens * itemsize:
            raise RuntimeError(f"merged {tmp}: {tmp.stat().st_size} bytes, expected {num_tokens * itemsize}")
        os.chmod(tmp, 0o666 & ~_umask())
        check_output_target(out, "--out")
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def _write_meta(meta_path: Path, meta: dict) -> None:
    """OUT.json, written last: it is the commit point of a preparation."""
    atomic_write(meta_path, json.dumps(meta, indent=1), what="--out")


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
