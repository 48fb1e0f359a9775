#!/usr/bin/env bash
# One call on 2 GPUs: the copy-engine reduce-scatter carrying bf16 gradients (summed in fp32) against the
# copy-engine all-gather alone, with torchtitan. Carry .titan and .whl; results under $OUT. When this ran,
# the plan's 8b default was the all-gather alone (now it is the reduce-scatter too, so run_8b asks for the all-gather alone).
set -uo pipefail
# shellcheck source=scripts/gpu/common.sh
source scripts/gpu/common.sh  # multicast off, unbuffered Python, torchao from .whl/ on PYTHONPATH
export OMP_NUM_THREADS=8
nvidia-smi -L > "$OUT/gpus.txt"; nproc >> "$OUT/gpus.txt"
trun=(python3 -m torch.distributed.run --standalone --nproc-per-node 2)
sets=(--set data.source=synthetic --set train.log_every=1 --set checkpoint.final=false)
titan() { PYTHONPATH="$PWD/.titan/torchtitan-src:$PYTHONPATH" timeout 130 "${trun[@]}" .titan/titan_bench.py --preset "$1" --batch 4 \
  --seq 2048 --compile on --ac none --fp8 "$2" --steps "$3" --warmup "$4" --out "$OUT/titan_$5.json" > "$OUT/titan_$5.log" 2>&1; echo "titan $5 rc=$? $(date +%T)"; }
ours() { local name=$1 preset=$2 steps=$3; shift 3
  TORCHINDUCTOR_CACHE_DIR="/tmp/ind/$name" timeout 130 "${trun[@]}" -m train run --config "$preset" --steps "$steps" "${sets[@]}" "$@" --out "$OUT/$name" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(date +%T)"; }
titan 8b none 10 3 8b
ours run_8b 8b 13 --set parallel.fsdp_symm_mem=all_gather
ours run_8b_all 8b 13 --set parallel.fsdp_symm_mem=all
titan 8b tensorwise 10 3 8b_fp8
ours run_8b_fp8_all 8b 13 --set fp8.backend=torchao --set parallel.fsdp_symm_mem=all
titan 1b none 15 4 1b
ours run_1b 1b 19
ours run_1b_ag 1b 19 --set parallel.fsdp_symm_mem=all_gather
cd "$OUT" && tar czf /tmp/all.tgz . && mv /tmp/all.tgz . && echo "done"
