"""Inputs the docs' examples assume the reader has, made offline for tests/test_docs_commands.py
(a page's ``<!-- docs-test: setup ... -->`` block runs this):

    python tests/docs_fixtures.py data-inputs DIR

writes into DIR what docs/data.md's ``train data prepare`` example reads: ``my-tokenizer/``
(a byte-level BPE of 512 ids trained here by ``tokenizers``, saved as a Hugging Face
tokenizer directory), ``corpus/*.txt``, ``more.jsonl``, ``part-0.parquet``,
``part-1.parquet`` and ``saved_dataset/`` (``datasets.save_to_disk``): documents from the
Python standard library's sources.
"""

from __future__ import annotations

import json
import sys
import sysconfig
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


if __name__ == "__main__":
    if sys.argv[1:2] != ["data-inputs"] or len(sys.argv) != 3:
        raise SystemExit("usage: python tests/docs_fixtures.py data-inputs DIR")
    data_inputs(Path(sys.argv[2]))
