#!/usr/bin/env bash
# 2 GPUs: the plan's defaults with the embedding unit's reduce-scatter on NCCL or on the copy engines.
# PROBE_RS_FIRST=1 selected the copy engines in the measured tree (4c656a0's code with the embedding
# unit kept on NCCL unless it was set); the code since has no such variable and takes the copy engines.
set -uo pipefail
# shellcheck source=scripts/gpu/common.sh
source scripts/gpu/common.sh  # multicast off, unbuffered Python, torchao from .whl/ on PYTHONPATH
export OMP_NUM_THREADS=8
nvidia-smi -L > "$OUT/gpus.txt"; nproc >> "$OUT/gpus.txt"
trun=(python3 -m torch.distributed.run --standalone --nproc-per-node 2)
sets=(--set data.source=synthetic --set train.log_every=1 --set checkpoint.final=false)
ours() { local name=$1 preset=$2 steps=$3 first=$4; shift 4
  PROBE_RS_FIRST=$first TORCHINDUCTOR_CACHE_DIR="/tmp/ind/$name" timeout 130 "${trun[@]}" -m train run --config "$preset" --steps "$steps" "${sets[@]}" "$@" --out "$OUT/$name" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(date +%T)"; }
ours run_8b 8b 13 0
ours run_8b_first 8b 13 1
ours run_1b 1b 19 0
ours run_1b_first 1b 19 1
ours run_1b_b 1b 19 0
ours run_1b_first_b 1b 19 1
cd "$OUT" && tar czf /tmp/all.tgz . && mv /tmp/all.tgz . && echo "done"
