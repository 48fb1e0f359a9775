"""``train data prepare`` with a tokenizer trained here by ``tokenizers`` on the embedded
corpus (no download): every input kind, resume, shards, bad input, and the tiny preset
trained by 2 gloo processes on the prepared file."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers", reason="the data extra (pip install 'hopper-train[data]') is not installed")
pq = pytest.importorskip("pyarrow.parquet", reason="the data extra is not installed")
datasets = pytest.importorskip("datasets", reason="the data extra is not installed")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

from testlib import one_error_line, torchrun, train_cli  # noqa: E402
from train.data import open_token_file  # noqa: E402
from train.metrics import read_metrics  # noqa: E402
from train.prepare import run as prep  # noqa: E402

VOCAB = 512


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Documents from the embedded corpus (stdlib sources) and a byte-level BPE tokenizer
    trained on them, saved as a Hugging Face tokenizer directory."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = [p.read_text(errors="replace") for p in sorted(root.glob("*.py"))[:60]]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(docs, trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    d = tmp_path_factory.mktemp("corpus")
    (d / "tok").mkdir()
    tok.save(str(d / "tok" / "tokenizer.json"))
    (d / "tok" / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return d, docs, tok


def _write_inputs(d: Path, docs: list[str]) -> list[str]:
    """The same documents as text files, JSONL, Parquet (2 row groups) and a datasets dir."""
    (d / "txt").mkdir(exist_ok=True)
    for i, doc in enumerate(docs[:10]):
        (d / "txt" / f"{i:02d}.txt").write_text(doc)
    (d / "a.jsonl").write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(docs[10:30])))
    import pyarrow as pa

    pq.write_table(pa.table({"text": docs[30:45]}), d / "b.parquet", row_group_size=8)
    datasets.Dataset.from_dict({"text": docs[45:60]}).save_to_disk(str(d / "ds"))
    return [str(d / "txt"), str(d / "a.jsonl"), str(d / "b.parquet"), str(d / "ds")]


def _docs_of(tokens: np.ndarray, eos: int) -> list[list[int]]:
    cuts = np.flatnonzero(tokens == eos)
    out, start = [], 0
    for c in cuts:
        out.append(tokens[start:c].tolist())
        start = c + 1
    assert start == len(tokens)  # every document ends with EOS
    return out


def test_every_input_kind_round_trips_and_workers_do_not_change_the_output(corpus, tmp_path, monkeypatch):
    d, docs, tok = corpus
    inputs = _write_inputs(tmp_path, docs)
    res = train_cli(["data", "prepare", *inputs, "--tokenizer", str(d / "tok"), "--out", str(tmp_path / "t.bin"),
                     "--workers", "2"])
    assert res.returncode == 0, res.stderr[-3000:]
    assert "tokens/s" in res.stdout
    meta = json.loads((tmp_path / "t.json").read_text())
    tokens, vocab = open_token_file(tmp_path / "t.bin")
    eos = tok.token_to_id("<|endoftext|>")
    assert vocab == VOCAB and meta["dtype"] == "uint16" and meta["num_tokens"] == len(tokens) > 100_000
    assert meta["eos_id"] == eos and meta["documents"] == 60 and len(meta["tokenizer"]["sha256"]) == 64
    assert meta["tokenizer"]["name"] == str(d / "tok")
    # Plan order: the txt directory, a.jsonl, b.parquet, ds (sorted inputs, sorted files).
    got = [tok.decode(ids) for ids in _docs_of(np.asarray(tokens), eos)]
    assert got == docs[:60]

    assert not (tmp_path / "t.bin.parts").exists()

    # Small units (many cut points): 2 worker processes and 1 in-process worker give the same bytes.
    monkeypatch.setattr(prep, "CHUNK_BYTES", 20_000)
    monkeypatch.setattr(prep, "ARROW_ROWS", 6)
    two = prep.prepare(inputs, tmp_path / "two.bin", str(d / "tok"), workers=2, progress=False)
    one = prep.prepare(inputs, tmp_path / "one.bin", str(d / "tok"), workers=1, progress=False)
    assert two.units == one.units > 20 and one.documents == 60
    assert (tmp_path / "one.bin").read_bytes() == (tmp_path / "two.bin").read_bytes()
    small, _ = open_token_file(tmp_path / "one.bin")
    assert [tok.decode(ids) for ids in _docs_of(np.asarray(small), eos)] == docs[:60]


def test_shards_and_resume_reuse_finished_units(corpus, tmp_path, caplog):
    d, docs, _ = corpus
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    prep.CHUNK_BYTES, chunk = 50_000, prep.CHUNK_BYTES
    try:
        out = tmp_path / "s.bin"
        a = prep.prepare([str(src)], out, str(d / "tok"), workers=1, shard=(0, 2), progress=False)
        assert not a.merged and not out.exists() and a.units >= 2
        parts = sorted((tmp_path / "s.bin.parts").glob("part-*.bin"))
        # An interrupted shard 1: one of its parts is gone, another half-written (a leftover tmp).
        prep.prepare([str(src)], out, str(d / "tok"), workers=1, shard=(1, 2), progress=False)
        every = sorted((tmp_path / "s.bin.parts").glob("part-*.bin"))
        assert len(every) > len(parts)
        every[-1].unlink()
        with caplog.at_level("INFO", logger="train.prepare"):
            merged = prep.prepare([str(src)], out, str(d / "tok"), workers=1, progress=False)
        assert merged.merged and merged.done_before == len(every) - 1
        assert "resuming" in caplog.text
        direct = prep.prepare([str(src)], tmp_path / "direct.bin", str(d / "tok"), workers=1, progress=False)
        assert out.read_bytes() == (tmp_path / "direct.bin").read_bytes() and direct.documents == len(docs)
        # Same inputs, same tokenizer: nothing to do.
        again = prep.prepare([str(src)], out, str(d / "tok"), workers=1, progress=False)
        assert again.units == 0 and again.num_tokens == merged.num_tokens
    finally:
        prep.CHUNK_BYTES = chunk


def test_inputs_changed_since_are_refused_not_taken_as_done(corpus, tmp_path):
    """Same paths, same tokenizer, but a file edited or added since: the token file is stale.
    It is never overwritten, and never reported as already prepared."""
    d, docs, _ = corpus
    src = tmp_path / "in"
    src.mkdir()
    for i in range(3):
        (src / f"{i}.txt").write_text(docs[i])
    out = tmp_path / "o.bin"
    first = prep.prepare([str(src)], out, str(d / "tok"), workers=1, progress=False)
    again = prep.prepare([str(src)], out, str(d / "tok"), workers=1, progress=False)
    assert again.units == 0 and again.num_tokens == first.num_tokens
    kept = out.read_bytes()
    for change in (lambda: (src / "0.txt").write_text(docs[0] + "\nmore"), lambda: (src / "3.txt").write_text(docs[3])):
        change()
        with pytest.raises(prep.PrepareError, match="they changed since"):
            prep.prepare([str(src)], out, str(d / "tok"), workers=1, progress=False)
        assert out.read_bytes() == kept


def _one_error(res) -> str:
    assert res.returncode == 2, res.stderr[-2000:]
    return one_error_line(res.stderr)


def test_bad_inputs_are_one_line_errors_and_nothing_is_overwritten(corpus, tmp_path):
    d, docs, _ = corpus
    good = tmp_path / "ok.jsonl"
    good.write_text(json.dumps({"text": docs[0]}) + "\n")
    tok = ["--tokenizer", str(d / "tok")]
    assert "no such file" in _one_error(train_cli(["data", "prepare", str(tmp_path / "nope.txt"), *tok,
                                                   "--out", str(tmp_path / "x.bin")]))
    err = _one_error(train_cli(["data", "prepare", str(good), "--tokenizer", "no-such-org/no-such-tokenizer",
                                "--out", str(tmp_path / "x.bin")], extra_env={"HF_HOME": str(tmp_path / "hf")}))
    assert "not found in the Hugging Face cache" in err and "--online" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "fine"}) + "\n" + "{oops\n")
    assert "line 2" in _one_error(train_cli(["data", "prepare", str(bad), *tok, "--out", str(tmp_path / "y.bin")]))
    import pyarrow as pa

    pq.write_table(pa.table({"text": docs[:2]}), tmp_path / "p.parquet")
    assert "no column 'body'" in _one_error(train_cli(["data", "prepare", str(tmp_path / "p.parquet"), *tok,
                                                        "--out", str(tmp_path / "z.bin"), "--text-field", "body"]))
    (tmp_path / "g.arrow").write_bytes(b"\xff" * 4000)  # was a pyarrow traceback
    assert "not a readable Arrow stream" in _one_error(train_cli(["data", "prepare", str(tmp_path / "g.arrow"), *tok,
                                                                  "--out", str(tmp_path / "g.bin")]))
    taken = tmp_path / "taken.bin"
    taken.write_bytes(b"precious")
    assert "exists" in _one_error(train_cli(["data", "prepare", str(good), *tok, "--out", str(taken)]))
    assert taken.read_bytes() == b"precious"
    assert "I/N" in _one_error(train_cli(["data", "prepare", str(good), *tok, "--out", str(tmp_path / "w.bin"),
                                          "--shard", "3"]))
    mine = tmp_path / "mine.bin.parts"  # a directory of the user's where the parts would go: never adopted, never removed
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    assert "no preparation's parts" in _one_error(train_cli(["data", "prepare", str(good), *tok,
                                                              "--out", str(tmp_path / "mine.bin")]))
    assert (mine / "notes.txt").read_text() == "precious"
    (tmp_path / "f.bin.parts").write_text("a file")
    assert "not a directory" in _one_error(train_cli(["data", "prepare", str(good), *tok,
                                                       "--out", str(tmp_path / "f.bin")]))


def test_tiny_preset_trains_on_prepared_text(corpus, tmp_path):
    """The issue's done-criterion: text -> `train data prepare` (local tokenizer) -> the tiny
    preset trained by 2 processes, loss going down."""
    d, docs, _ = corpus
    src = tmp_path / "corpus.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    res = train_cli(["data", "prepare", str(src), "--tokenizer", str(d / "tok"), "--out", str(tmp_path / "c.bin")])
    assert res.returncode == 0, res.stderr[-3000:]
    out = tmp_path / "run"
    run = torchrun(["run", "--config", "tiny", "--steps", "30", "--out", str(out), "--set", "data.source=file",
                    "--set", f"data.path={tmp_path / 'c.bin'}", "--set", f"model.vocab_size={VOCAB}",
                    "--set", f"data.tokenizer={d / 'tok'}", "--set", "train.log_every=5",
                    "--set", "metrics.progress=false", "--set", "checkpoint.every=0"])
    assert run.returncode == 0, run.stderr[-3000:]
    rows = read_metrics(out / "metrics.jsonl")
    assert rows[-1]["step"] == 30 and rows[-1]["loss"] < rows[0]["loss"] - 1.0, [r["loss"] for r in rows]
    wrong = train_cli(["run", "--config", "tiny", "--steps", "2", "--out", str(tmp_path / "wrong"),
                       "--set", "data.source=file", "--set", f"data.path={tmp_path / 'c.bin'}",
                       "--set", f"model.vocab_size={VOCAB}", "--set", "data.tokenizer=gpt2"])
    lines = [ln for ln in wrong.stderr.splitlines() if ln.startswith("error:")]
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr, wrong.stderr[-2000:]  # bad input
    assert len(lines) == 1 and "data.tokenizer=gpt2" in lines[0] and "was prepared with tokenizer" in lines[0]


def test_empty_input_name_is_refused(corpus, tmp_path):
    """``''`` as an input is Path('.'), the current directory: refused, not tokenized."""
    d, _, _ = corpus
    res = train_cli(["data", "prepare", "", "--tokenizer", str(d / "tok"), "--out", str(tmp_path / "e.bin")])
    assert "input '': empty name" in _one_error(res)
    assert not (tmp_path / "e.bin").exists() and not (tmp_path / "e.json").exists()


def test_hostile_rows_are_one_line_errors_or_read_as_text(corpus, tmp_path):
    """JSON nested past the parser's recursion limit and a non-string Parquet column were
    tracebacks; a lone surrogate (valid JSON, not UTF-8) is replaced, as in text files."""
    d, _, _ = corpus
    tok = ["--tokenizer", str(d / "tok")]
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"text": ' + "[" * 100000 + "]" * 100000 + "}\n")
    assert "line 1" in _one_error(train_cli(["data", "prepare", str(deep), *tok, "--out", str(tmp_path / "d.bin")]))
    import pyarrow as pa

    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "ints.parquet")
    assert "column 'text' holds int64, not strings" in _one_error(
        train_cli(["data", "prepare", str(tmp_path / "ints.parquet"), *tok, "--out", str(tmp_path / "i.bin")]))
    surrogate = tmp_path / "s.jsonl"
    surrogate.write_text('{"text": "a\\ud800b"}\n')
    res = train_cli(["data", "prepare", str(surrogate), *tok, "--out", str(tmp_path / "s.bin")])
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
