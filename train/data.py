"""Token streams for training.

Three sources, one interface (``next_batch()`` plus ``state_dict()``/``load_state_dict()``):

* ``embedded``: real text with no download. A byte-level corpus built once from the
  Python standard library's own ``.py`` files (present wherever Python is), cached as a
  memory-mapped uint16 token file. Vocabulary: 256 byte values.
* ``file``: a user token file, nanoGPT style: a flat uint16/uint32 array (``x.bin``)
  with ``x.json`` beside it: ``{"dtype": "uint16", "vocab_size": 50257}``.
* ``synthetic``: seeded random tokens, for benchmarks.

Sampling: the stream is cut into non-overlapping windows of ``seq_len + 1`` tokens. Each
epoch shuffles the windows with a permutation seeded by (seed, epoch), identical on all
ranks; data-parallel rank r takes windows r, r + W, r + 2W... so shards are disjoint.
The position (epoch, cursor) is saved in checkpoints.
"""

from __future__ import annotations

import json
import os
import stat
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from core.errors import InputError
from core.safety import atomic_write, excerpt, excerpt_path, file_kind, parse_json, probe_path, read_bounded
from train.errors import DataError
from train.paths import default_cache_dir

EMBEDDED_VOCAB = 256
_DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


def _stdlib_sources() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def build_embedded_corpus(cache_dir: Path, max_mb: int) -> Path:
    """Write (once) the embedded byte-level corpus and return its path.

    The file is written to a temporary name and renamed, so concurrent ranks and
    interrupted builds never see a partial file.
    """
    cache_dir.mkdir(parents=True, exist_ok=True)
    path, limit = _corpus_file(cache_dir, max_mb)
    if cached_corpus(cache_dir, max_mb):
        return path
    chunks, total = [], 0
    for src in _stdlib_sources():
        try:
            data = src.read_bytes()
        except OSError:
            continue
        chunks.append(data + b"\n\n")
        total += len(data) + 2
        if total >= limit:
            break
    blob = b"".join(chunks)[:limit]
    if len(blob) < 1 << 20:
        raise DataError(f"embedded corpus: only {len(blob)} bytes of stdlib source found under {sysconfig.get_paths()['stdlib']}")
    tokens = np.frombuffer(blob, dtype=np.uint8).astype(np.uint16)
    atomic_write(path, tokens.tobytes(), what="embedded corpus cache")
    return path


def _corpus_file(cache_dir: Path, max_mb: int) -> tuple[Path, int]:
    """The embedded corpus's file in ``cache_dir`` and its cap in bytes of source text."""
    return cache_dir / f"stdlib-bytes-{max_mb}mb.bin", max_mb * 1024 * 1024


def cached_corpus(cache_dir: Path, max_mb: int) -> bool:
    """Whether ``cache_dir`` holds the corpus :func:`build_embedded_corpus` writes: a regular file
    of 1 MiB..``max_mb`` MiB of bytes as uint16 tokens. Anything else by that name (a FIFO would
    block the memory map, an empty or odd-sized file fails it) is named, not read, and left as it is."""
    path, limit = _corpus_file(cache_dir, max_mb)
    try:
        st = probe_path(path, "data.cache_dir")
    except InputError as exc:
        raise DataError(str(exc)) from None
    if st is None:
        return False
    lo, hi = 2 << 20, 2 * limit
    if stat.S_ISREG(st.st_mode) and lo <= st.st_size <= hi and st.st_size % 2 == 0:
        return True
    kind = f"{st.st_size} bytes" if stat.S_ISREG(st.st_mode) else file_kind(st.st_mode)
    raise DataError(f"data.cache_dir: {excerpt_path(path)} is {kind}, not an embedded corpus this program wrote "
                    f"(a regular file of {lo}..{hi} bytes, an even count): remove it, or set another data.cache_dir")


_DTYPE_VOCAB_MAX = {"uint16": 1 << 16, "uint32": 1 << 32}
_SAMPLE = 1 << 20  # tokens checked at load from each end of the file


def _meta_int(meta_path: Path, meta: dict, key: str, lo: int, hi: int) -> int:
    value = meta[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise DataError(f"data.path: metadata {meta_path}: {key} must be an integer, got {excerpt(value)}")
    if not lo <= value <= hi:
        raise DataError(f"data.path: metadata {meta_path}: {key}={value} is outside {lo}..{hi}")
    return value


def check_token_ids(tokens: np.ndarray, vocab: int, where: str, offset: int = 0) -> None:
    """Every id < ``vocab``: an id beyond the vocabulary must never reach the embedding."""
    if tokens.size and int(tokens.max()) >= vocab:
        bad = int(np.argmax(np.asarray(tokens) >= vocab))
        raise DataError(f"data.path: {where}: token id {int(tokens[bad])} at token {offset + bad} is not below "
                        f"vocab_size={vocab} (wrong dtype in the metadata, or a different tokenizer?)")


def open_token_file(path: Path) -> tuple[np.memmap, int]:
    """Open a user token file; returns (tokens, vocab_size). Errors name the file.

    Checked at load: the metadata's types and ranges (dtype uint16|uint32, 1 <= vocab_size
    <= what the dtype can hold, num_tokens when given), the file size against dtype and
    num_tokens, and the token ids of the first and last million tokens against vocab_size
    (plus the tell-tale zero high halves of uint32 data declared uint16). Every batch is
    checked again when it is read (``TokenLoader``), so no id >= vocab_size is trained on."""
    if not path.name or path.name == "..":  # '/', '.', 'dir/..': a directory, and with_suffix() would raise
        raise DataError(f"data.path: {excerpt_path(path)} names a directory, not a token file")
    meta_path = path.with_suffix(".json")
    for what, file, absent in (("token file", path, "does not exist"),
                               ("metadata", meta_path, "is missing (needs dtype and vocab_size)")):
        try:  # a name the file system refuses (too long, a NUL, no permission): one line naming it
            st = probe_path(file, f"data.path: {what}")
        except InputError as exc:
            raise DataError(str(exc)) from None
        if st is None:
            raise DataError(f"data.path: {what} {excerpt_path(file)} {absent}")
        if not stat.S_ISREG(st.st_mode):  # a directory was "does not exist", a FIFO blocked the read
            raise DataError(f"data.path: {what} {excerpt_path(file)} is {file_kind(st.st_mode)}, not a file")
    try:
        meta = parse_json(read_bounded(meta_path, "data.path: metadata", 1 << 16).decode("utf-8"))
    except InputError as exc:
        raise DataError(str(exc)) from None
    except ValueError as exc:  # malformed JSON (parse_json: nested too deeply too), not UTF-8
        raise DataError(f"data.path: metadata {meta_path} is not JSON ({exc.__class__.__name__})") from None
    if not isinstance(meta, dict):
        raise DataError(f"data.path: metadata {meta_path} must be a JSON object")
    for key in ("dtype", "vocab_size"):
        if key not in meta:
            raise DataError(f"data.path: metadata {meta_path} is invalid (missing {key!r})")
    if not isinstance(meta["dtype"], str) or meta["dtype"] not in _DTYPES:
        raise DataError(f"data.path: metadata {meta_path}: dtype must be uint16 or uint32, got {excerpt(meta['dtype'])}")
    dtype = _DTYPES[meta["dtype"]]
    vocab = _meta_int(meta_path, meta, "vocab_size", 1, _DTYPE_VOCAB_MAX[meta["dtype"]])
    size = path.stat().st_size
    itemsize = np.dtype(dtype).itemsize
    if size % itemsize:
        raise DataError(f"data.path: {path} is truncated ({size} bytes is not a multiple of {itemsize})")
    count = size // itemsize
    if "num_tokens" in meta:
        declared = _meta_int(meta_path, meta, "num_tokens", 0, 1 << 48)
        if declared != count:
            kind = "is truncated" if count < declared else "does not match its metadata"
            raise DataError(f"data.path: {path} {kind}: {count} {meta['dtype']} tokens, metadata says {declared}"
                            + (" (the file holds twice as many: written as uint32?)" if count == 2 * declared else ""))
    if count == 0:
        raise DataError(f"data.path: {path} is empty")
    tokens = np.memmap(path, dtype=dtype, mode="r")
    head, tail = tokens[:_SAMPLE], tokens[max(count - _SAMPLE, 0):]
    check_token_ids(head, vocab, str(path))
    check_token_ids(tail, vocab, str(path), offset=max(count - _SAMPLE, 0))
    if meta["dtype"] == "uint16" and head.size >= 64 and head.size % 2 == 0:
        odd = np.asarray(head[1::2])
        if not odd.any() and np.asarray(head[0::2]).any():
            raise DataError(f"data.path: {path}: every second uint16 token is 0: this looks like uint32 data "
                            "declared as uint16 in the metadata")
    return tokens, vocab


def write_token_file(path: Path, tokens: np.ndarray, vocab_size: int) -> None:
    """Write a token file + metadata in the format :func:`open_token_file` reads."""
    dtype = "uint16" if vocab_size <= 65536 else "uint32"
    arr = np.asarray(tokens, dtype=_DTYPES[dtype])
    atomic_write(path, arr.tobytes(), what="token file")
    atomic_write(path.with_suffix(".json"),
                 json.dumps({"dtype": dtype, "vocab_size": vocab_size, "num_tokens": int(arr.size)}), what="metadata")


def check_tokenizer(path: Path, expected: str) -> None:
    """``data.tokenizer``: the token file's metadata (written by ``train data prepare``) must
    name this tokenizer, by the name/path it was prepared with or a sha256 prefix."""
    if not expected:
        return
    meta_path = path.with_suffix(".json")
    tok = parse_json(meta_path.read_text()).get("tokenizer")
    if not isinstance(tok, dict):
        raise DataError(f"data.tokenizer={expected}: {meta_path} records no tokenizer (prepare the file with "
                        "`train data prepare`)")
    name, sha = str(tok.get("name", "")), str(tok.get("sha256", ""))
    mine = probe_path(expected, "data.tokenizer")  # too long: exists() raised OSError
    try:
        same_path = mine is not None and os.path.samefile(expected, name)
    except (OSError, ValueError):  # the recorded name is no path here (a Hub name, gone, too long)
        same_path = False
    if expected == name or same_path or (len(expected) >= 8 and sha.startswith(expected.lower())):
        return
    raise DataError(f"data.tokenizer={expected}: {path} was prepared with tokenizer {name} (sha256 {sha[:12]})")


def to_device(batch: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host batch to ``device`` without a stream sync: a copy from pageable memory waits for
    all queued GPU work (CUDA's rule for pageable host-to-device copies); a pinned one does not."""
    if device.type == "cuda" and batch.device.type == "cpu" and not batch.is_pinned():
        batch = batch.pin_memory()
    return batch.to(device, non_blocking=True)


@dataclass
class ShardInfo:
    rank: int = 0  # data-parallel rank
    world: int = 1  # data-parallel world size


class TokenLoader:
    """Disjoint, resumable per-rank batches of (inputs, targets)."""

    def __init__(self, tokens, seq_len: int, batch_size: int, shard: ShardInfo, seed: int,
                 vocab_size: int, synthetic: bool = False):
        self.tokens = tokens
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.shard = shard
        self.seed = seed
        self.vocab_size = vocab_size
        self.synthetic = synthetic
        self.window = seq_len + 1
        self.num_windows = (len(tokens) // self.window) if not synthetic else 1 << 30
        per_rank = self.num_windows // shard.world
        if per_rank < batch_size:
            raise DataError(
                f"data: {self.num_windows} windows of {self.window} tokens cannot fill a batch of "
                f"{batch_size} on each of {shard.world} ranks"
            )
        self.per_rank = per_rank
        self.epoch = 0
        self.cursor = 0  # windows consumed by this rank in the current epoch
        self._perm: np.ndarray | None = None

    def _permutation(self) -> np.ndarray:
        if self._perm is None:
            rng = np.random.default_rng([self.seed, self.epoch])
            self._perm = rng.permutation(self.num_windows)
        return self._perm

    def _window(self, k: int) -> np.ndarray:
        if self.synthetic:
            rng = np.random.default_rng([self.seed, self.epoch, k])
            return rng.integers(0, self.vocab_size, size=self.window, dtype=np.int64)
        start = int(self._permutation()[k]) * self.window
        window = np.asarray(self.tokens[start:start + self.window], dtype=np.int64)
        check_token_ids(window, self.vocab_size, "token file", offset=start)
        return window

    def window_ids(self, count: int) -> list[int]:
        """Global window indices this rank reads next (for tests of disjointness)."""
        return [(self.cursor + i) * self.shard.world + self.shard.rank for i in range(count)]

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cursor + self.batch_size > self.per_rank:
            self.epoch += 1
            self.cursor = 0
            self._perm = None
        ids = self.window_ids(self.batch_size)
        self.cursor += self.batch_size
        batch = torch.from_numpy(np.stack([self._window(k) for k in ids]))
        return batch[:, :-1], batch[:, 1:]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor, "world": self.shard.world, "rank": self.shard.rank}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """A position saved by :meth:`state_dict`; a value of the wrong type or range (a
        negative epoch or cursor) is a ValueError naming the key. A cursor past this rank's
        shard (another world size) starts the next epoch, as at the end of every epoch."""
        for key in ("epoch", "cursor"):
            value = state[key]
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 62:
                raise ValueError(f"data.{key}={repr(value)[:40] if isinstance(value, (int, float)) else excerpt(value)} "
                                 "is not a non-negative integer")
        self.epoch = state["epoch"]
        self.cursor = state["cursor"]
        self._perm = None


def build_loader(data_cfg, seq_len: int, batch_size: int, shard: ShardInfo, seed: int,
                 model_vocab: int) -> TokenLoader:
    if data_cfg.source == "synthetic":
        return TokenLoader(np.zeros(0, np.uint16), seq_len, batch_size, shard, seed, model_vocab, synthetic=True)
    if data_cfg.source == "embedded":
        cache = Path(data_cfg.cache_dir) if data_cfg.cache_dir else default_cache_dir()
        path = build_embedded_corpus(cache, data_cfg.embedded_mb)
        tokens, vocab = np.memmap(path, dtype=np.uint16, mode="r"), EMBEDDED_VOCAB
    else:
        tokens, vocab = open_token_file(Path(data_cfg.path))
        check_tokenizer(Path(data_cfg.path), data_cfg.tokenizer)
    if vocab > model_vocab:
        raise DataError(f"model.vocab_size: {model_vocab} is smaller than the data's vocabulary ({vocab})")
    return TokenLoader(tokens, seq_len, batch_size, shard, seed, vocab)
