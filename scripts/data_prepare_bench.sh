#!/usr/bin/env bash
# Preparation throughput of `train data prepare` on this machine, offline:
#   1. a JSONL corpus of the Python standard library's sources (CORPUS_MB, default 64 MiB of text),
#   2. a byte-level BPE tokenizer with a realistic vocabulary (VOCAB, default 32000) trained on
#      its first 8 MiB by the `tokenizers` library,
#   3. `train data prepare` with 1 and with 2 worker processes (tokens/s is printed by the command).
#
#   bash scripts/data_prepare_bench.sh        (repo root; work files in ${WORK:-/tmp/prepare-bench})
set -euo pipefail
PY=${PYTHON:-python3}
WORK=${WORK:-/tmp/prepare-bench}
CORPUS_MB=${CORPUS_MB:-64}
VOCAB=${VOCAB:-32000}
mkdir -p "$WORK"
"$PY" - "$WORK" "$CORPUS_MB" "$VOCAB" <<'PYEOF'
import json, sys, sysconfig
from pathlib import Path
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

work, mb, vocab = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
root = Path(sysconfig.get_paths()["stdlib"])
docs = [p.read_text(errors="replace") for p in sorted(root.rglob("*.py")) if "site-packages" not in p.parts]
out, size, rounds = [], 0, 0
while size < mb << 20:  # repeat the sources when the stdlib is smaller than CORPUS_MB
    for d in docs:
        out.append(json.dumps({"text": d}) + "\n")
        size += len(d)
        if size >= mb << 20:
            break
(work / "corpus.jsonl").write_text("".join(out))
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
sample, n = [], 0
for d in docs:
    sample.append(d)
    n += len(d)
    if n > 8 << 20:
        break
tok.train_from_iterator(sample, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                                    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tok.save(str(work / "tokenizer.json"))
print(f"corpus: {len(out)} documents, {size / 2**20:.0f} MiB of text; tokenizer vocab {tok.get_vocab_size()}")
PYEOF
for w in 1 2; do
  rm -f "$WORK/tokens-$w.bin" "$WORK/tokens-$w.json"
  rm -rf "$WORK/tokens-$w.bin.parts"
  "$PY" -m train data prepare "$WORK/corpus.jsonl" --tokenizer "$WORK/tokenizer.json" --out "$WORK/tokens-$w.bin" \
    --workers "$w" 2>/dev/null
done
cmp "$WORK/tokens-1.bin" "$WORK/tokens-2.bin" && echo "1 and 2 workers: identical token files"
