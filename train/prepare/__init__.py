"""``train data prepare``: text -> the token file that ``data.source=file`` reads.

Modules: ``tokenizer`` (resolve ``--tokenizer``), ``units`` (cut the inputs into units),
``worker`` (tokenize one unit into a part file), ``run`` (plan, resume, workers, merge),
``cli`` (the ``train data`` group).

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
