#!/usr/bin/env bash
# One call on one GPU: 1b, torchtitan, then the defaults with a loss chunk of 8192 tokens (what the
# plan chose before this folder) and of 4096. Carry .titan and .whl. Results under $OUT.
set -uo pipefail
# shellcheck source=scripts/gpu/common.sh
source scripts/gpu/common.sh  # multicast off, unbuffered Python, torchao from .whl/ on PYTHONPATH
export OMP_NUM_THREADS=8
nvidia-smi -L > "$OUT/gpus.txt"; nproc >> "$OUT/gpus.txt"
trun=(python3 -m torch.distributed.run --standalone --nproc-per-node 1)
sets=(--set data.source=synthetic --set train.log_every=1 --set checkpoint.final=false)
PYTHONPATH="$PWD/.titan/torchtitan-src:$PYTHONPATH" timeout 120 "${trun[@]}" .titan/titan_bench.py --preset 1b --batch 4 \
  --seq 2048 --compile on --ac none --fp8 none --steps 15 --warmup 4 --out "$OUT/titan_1b.json" > "$OUT/titan_1b.log" 2>&1
for chunk in 8192 4096; do
  name=run_1b; [ "$chunk" = 8192 ] || name=run_1b_c$chunk
  timeout 110 "${trun[@]}" -m train run --config 1b --steps 19 "${sets[@]}" --set "train.loss_chunk_tokens=$chunk" \
    --out "$OUT/$name" > "$OUT/$name.log" 2>&1
done
