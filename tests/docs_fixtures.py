"""Inputs the docs' examples assume the reader has, made offline for tests/test_docs_commands.py
(a page's ``<!-- docs-test: setup ... -->`` block runs this):

    python tests/docs_fixtures.py data-inputs DIR

writes into DIR what docs/data.md's ``train data prepare`` example reads: ``my-tokenizer/``
(a byte-level BPE of 512 ids trained here by ``tokenizers``, saved as a Hugging Face
tokenizer directory), ``corpus/*.txt``, ``more.jsonl``, ``part-0.parquet``,
``part-1.parquet`` and ``saved_dataset/`` (``datasets.save_to_disk``): documents from the
Python standard library's sources.

With ``DOCS_FIXTURES_CACHE`` set (tests/test_docs_commands.py sets it to one directory per
test session), the files are made once there and copied into DIR for every later page.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

VOCAB = 512


def data_inputs(out: Path) -> None:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    sources = [p.read_text(errors="replace") for p in sorted(stdlib.glob("*.py"))[:48]]
    docs = [text[:2048] for text in sources[:24]]  # small: the example runs in seconds
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(sources, trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    (out / "my-tokenizer").mkdir(parents=True)
    tok.save(str(out / "my-tokenizer" / "tokenizer.json"))
    (out / "my-tokenizer" / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    (out / "corpus").mkdir()
    for i, doc in enumerate(docs[:6]):
        (out / "corpus" / f"{i:02d}.txt").write_text(doc)
    (out / "more.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs[6:12]))
    for k in range(2):
        pq.write_table(pa.table({"text": docs[12 + 3 * k:15 + 3 * k]}), out / f"part-{k}.parquet")
    datasets.Dataset.from_dict({"text": docs[18:24]}).save_to_disk(str(out / "saved_dataset"))


def cached_data_inputs(out: Path, cache: Path) -> None:
    """``data_inputs(out)``, made once under ``cache`` (the same files: nothing in them depends
    on DIR) and copied; an entry that already exists in ``out`` is an error, as it is there."""
    made = cache / "data-inputs"
    if not made.is_dir():
        cache.mkdir(parents=True, exist_ok=True)
        fresh = Path(tempfile.mkdtemp(dir=cache))
        data_inputs(fresh)
        try:
            fresh.rename(made)
        except OSError:  # another page made it first
            shutil.rmtree(fresh)
    for entry in sorted(made.iterdir()):
        if entry.is_dir():
            shutil.copytree(entry, out / entry.name)
        elif (out / entry.name).exists():
            raise FileExistsError(out / entry.name)
        else:
            shutil.copy2(entry, out / entry.name)


if __name__ == "__main__":
    if sys.argv[1:2] != ["data-inputs"] or len(sys.argv) != 3:
        raise SystemExit("usage: python tests/docs_fixtures.py data-inputs DIR")
    if os.environ.get("DOCS_FIXTURES_CACHE"):
        cached_data_inputs(Path(sys.argv[2]), Path(os.environ["DOCS_FIXTURES_CACHE"]))
    else:
        data_inputs(Path(sys.argv[2]))
