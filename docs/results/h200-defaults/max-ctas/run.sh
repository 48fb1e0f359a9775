#!/usr/bin/env bash
# One call on 2 GPUs: 8b torchtitan, then our defaults (04307dc) with NCCL_MAX_CTAS unset / 16 / 8 / 4;
# FP8 with it unset and 8. Carry .titan and .whl; results under $OUT.
set -uo pipefail
# shellcheck source=scripts/gpu/common.sh
source scripts/gpu/common.sh  # multicast off, unbuffered Python, torchao from .whl/ on PYTHONPATH
export OMP_NUM_THREADS=8
nvidia-smi -L > "$OUT/gpus.txt"; nproc >> "$OUT/gpus.txt"; python3 -c 'import torch;print(torch.__version__, torch.cuda.nccl.version())' >> "$OUT/gpus.txt"
trun=(python3 -m torch.distributed.run --standalone --nproc-per-node 2)
sets=(--set data.source=synthetic --set train.log_every=1 --set checkpoint.final=false)
titan() { PYTHONPATH="$PWD/.titan/torchtitan-src:$PYTHONPATH" timeout 130 "${trun[@]}" .titan/titan_bench.py --preset 8b --batch 4 \
  --seq 2048 --compile on --ac none --fp8 "$1" --steps 10 --warmup 3 --out "$OUT/titan_$2.json" > "$OUT/titan_$2.log" 2>&1; echo "titan $2 rc=$?"; }
ours() { local name=$1 cta=$2; shift 2
  if [ "$cta" = unset ]; then env -u NCCL_MAX_CTAS TORCHINDUCTOR_CACHE_DIR="/tmp/ind/$name" timeout 130 "${trun[@]}" -m train run --config 8b --steps 13 "${sets[@]}" "$@" --out "$OUT/$name" > "$OUT/$name.log" 2>&1
  else NCCL_MAX_CTAS=$cta TORCHINDUCTOR_CACHE_DIR="/tmp/ind/$name" timeout 130 "${trun[@]}" -m train run --config 8b --steps 13 "${sets[@]}" "$@" --out "$OUT/$name" > "$OUT/$name.log" 2>&1; fi
  echo "$name rc=$? $(date +%T)"; }
titan none 8b
ours run_8b unset
ours run_8b_cta8 8
ours run_8b_cta4 4
ours run_8b_cta16 16
titan tensorwise 8b_fp8
ours run_8b_fp8 unset --set fp8.backend=torchao
ours run_8b_fp8_cta8 8 --set fp8.backend=torchao
cd "$OUT" && tar czf all.tgz --exclude=all.tgz . && echo "done"
