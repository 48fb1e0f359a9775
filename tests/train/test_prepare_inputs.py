"""``train data prepare`` and ``data.path`` against inputs that are wrong in ways the
happy path never sees: tokenizers whose ids do not follow ``get_vocab_size()``, a Parquet
file with a corrupted data page, links placed where part files go, a ``data.path`` that
names a directory. Each is one line naming the culprit (exit 2) or, for the tokenizer
ids, a correct file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers", reason="the data extra (pip install 'hopper-train[data]') is not installed")
pa = pytest.importorskip("pyarrow", reason="the data extra is not installed")
pq = pytest.importorskip("pyarrow.parquet", reason="the data extra is not installed")

from tokenizers import Tokenizer, models, pre_tokenizers, processors  # noqa: E402

from testlib import SMALL_RUN, one_error_line, train_cli  # noqa: E402
from train.data import open_token_file  # noqa: E402
from train.errors import PrepareError  # noqa: E402
from train.prepare import worker  # noqa: E402
from train.prepare.tokenizer import vocab_size  # noqa: E402
from train.prepare.units import Unit  # noqa: E402


def _word_level(path: Path, vocab: dict, post=None) -> str:
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if post is not None:
        tok.post_processor = post
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return str(path)


def _prepare(tmp_path: Path, tokenizer: str, inputs: list[str], out: str = "out.bin"):
    return train_cli(["data", "prepare", *inputs, "--tokenizer", tokenizer, "--out", str(tmp_path / out),
                      "--workers", "1"])


# ----------------------------------------------------------------------------- vocabulary size


@pytest.mark.parametrize("top, dtype", [(70000, "uint32"), (500, "uint16")])
def test_vocabulary_with_gaps_gets_the_largest_id_plus_one(tmp_path, top, dtype):
    """A 3-entry WordLevel vocabulary with id 70000 was an OverflowError traceback in the
    worker (uint16 from get_vocab_size() = 3); with id 500, a file train run refused."""
    tok = _word_level(tmp_path / "tok" / "tokenizer.json", {"[UNK]": 0, "hello": top, "world": 5})
    (tmp_path / "in.txt").write_text("hello world hello\nworld\n")
    res = _prepare(tmp_path, tok, [str(tmp_path / "in.txt")])
    assert res.returncode == 0, res.stderr[-3000:]
    tokens, vocab = open_token_file(tmp_path / "out.bin")
    meta = json.loads((tmp_path / "out.json").read_text())
    assert vocab == top + 1 and meta["dtype"] == dtype
    assert list(np.asarray(tokens)) == [top, 5, top, 5]


def test_vocabulary_size_refuses_ids_no_token_file_holds():
    class Fake:
        def __init__(self, vocab):
            self.vocab = vocab

        def get_vocab(self, with_added_tokens=True):
            return self.vocab

        def get_vocab_size(self, with_added_tokens=True):
            return len(self.vocab)

    assert vocab_size(Fake({"a": 0, "b": 9}), "t", eos_id=11) == 12
    with pytest.raises(PrepareError, match="--tokenizer 't': has token id 4294967296"):
        vocab_size(Fake({"a": 0, "b": 1 << 32}), "t", None)
    with pytest.raises(PrepareError, match="empty vocabulary"):
        vocab_size(Fake({}), "t", None)


def test_post_processor_id_outside_the_vocabulary_is_refused_naming_the_tokenizer(tmp_path):
    post = processors.TemplateProcessing(single="$A [X]", special_tokens=[("[X]", 900)])
    tok = _word_level(tmp_path / "tok" / "tokenizer.json", {"[UNK]": 0, "hello": 1, "world": 2}, post)
    (tmp_path / "in.jsonl").write_text(json.dumps({"text": "hello world"}) + "\n")
    res = _prepare(tmp_path, tok, [str(tmp_path / "in.jsonl")])
    line = one_error_line(res.stderr)
    assert res.returncode == 2 and "--tokenizer: produced token id 900" in line and "in.jsonl" in line, line
    assert not (tmp_path / "out.bin").exists()


# ----------------------------------------------------------------------------- corrupted inputs


def test_corrupted_parquet_page_names_the_input_and_row_group(tmp_path):
    tok = _word_level(tmp_path / "tok" / "tokenizer.json", {"[UNK]": 0, "hello": 1, "world": 2})
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": ["hello world"] * 40}), path, row_group_size=10, compression="none")
    offset = pq.ParquetFile(path).metadata.row_group(2).column(0).data_page_offset
    with open(path, "r+b") as fh:  # the page header of row group 2: the footer still reads
        fh.seek(offset)
        fh.write(b"\x0f" * 16)
    res = _prepare(tmp_path, tok, [str(path)])
    line = one_error_line(res.stderr)
    assert res.returncode == 2 and f"input {path}: row group 2 cannot be read" in line, line
    assert "--out" not in line


# ----------------------------------------------------------------------------- part files


def test_part_files_never_write_through_links_placed_at_their_names(tmp_path):
    from core.errors import InputError

    _word_level(tmp_path / "tok.json", {"[UNK]": 0, "hello": 1, "world": 2})
    worker.init_worker((tmp_path / "tok.json").read_text())
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    src = tmp_path / "in.txt"
    src.write_text("hello world\n")
    unit = Unit("text", str(src), 0, src.stat().st_size, last=True)
    parts = tmp_path / "out.bin.parts"
    parts.mkdir()
    part = parts / "part-000000.bin"
    (parts / f"part-000000.bin.tmp{os.getpid()}").symlink_to(victim)  # the old predictable temporary name
    assert worker.tokenize_unit(unit, "text", None, "uint16", 3, str(part)) == (2, 1)
    assert victim.read_text() == "keep" and np.fromfile(part, dtype=np.uint16).tolist() == [1, 2]
    assert json.loads((parts / "part-000000.json").read_text())["num_tokens"] == 2
    (parts / "part-000000.json").unlink()
    (parts / "part-000000.json").symlink_to(victim)  # at the name itself: refused, not followed
    with pytest.raises(InputError, match="is a symbolic link"):
        worker.tokenize_unit(unit, "text", None, "uint16", 3, str(part))
    assert victim.read_text() == "keep"


# ----------------------------------------------------------------------------- data.path


@pytest.mark.parametrize("value", ["/", ".", "..", "sub/.."])
def test_data_path_naming_a_directory_is_one_line(tmp_path, value):
    res = train_cli(["run", "--out", str(tmp_path / "run"), "--steps", "1", *SMALL_RUN,
                     "--set", "data.source=file", "--set", f"data.path={value}"])
    line = one_error_line(res.stderr)
    assert res.returncode == 2 and line.startswith("error: data.path"), line


# ----------------------------------------------------------------------------- an input given twice


@pytest.mark.parametrize("how", ["same-name", "dot-slash", "symlink", "hardlink", "dir-and-file-in-it",
                                 "dir-twice-by-two-names", "file-via-dir-link"])
def test_an_input_given_twice_is_refused_and_nothing_is_written(tmp_path, how):
    tok = _word_level(tmp_path / "tok" / "tokenizer.json", {"[UNK]": 0, "hello": 1, "world": 2})
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    a = corpus / "a.txt"
    a.write_text("hello world\n")
    (corpus / "b.txt").write_text("world hello\n")
    first, second = {
        "same-name": (str(a), str(a)),
        "dot-slash": (str(a), f"{corpus}/./a.txt"),
        "symlink": (str(a), str(_link(tmp_path / "l.txt", a))),
        "hardlink": (str(a), str(_hard(tmp_path / "h.txt", a))),
        "dir-and-file-in-it": (str(corpus), str(a)),
        "dir-twice-by-two-names": (str(corpus), str(_link(tmp_path / "c2", corpus))),
        "file-via-dir-link": (str(_link(tmp_path / "c3", corpus) / "a.txt"), str(corpus)),
    }[how]
    res = _prepare(tmp_path, tok, [first, second])
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "input" in lines[0] and ("given twice" in lines[0] or "also read through" in lines[0]), lines[0]
    assert not (tmp_path / "out.bin").exists() and not (tmp_path / "out.json").exists()


def test_distinct_inputs_with_equal_contents_are_both_read(tmp_path):
    """Two different files (equal text) are two inputs: only the same file twice is refused."""
    tok = _word_level(tmp_path / "tok" / "tokenizer.json", {"[UNK]": 0, "hello": 1, "world": 2})
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text("hello world\n")
    res = _prepare(tmp_path, tok, [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")])
    assert res.returncode == 0, res.stderr


def _link(path: Path, target: Path) -> Path:
    path.symlink_to(target)
    return path


def _hard(path: Path, target: Path) -> Path:
    os.link(target, path)
    return path
