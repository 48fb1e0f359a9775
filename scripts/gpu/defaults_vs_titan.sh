#!/usr/bin/env bash
# The presets as a user runs them, against torchtitan, on 2 GPUs of one host, in one call:
#   torchrun --nproc-per-node 2 -m train run --config P --set data.source=synthetic --steps N
# (the automatic plan decides the rest) and torchtitan (.titan/titan_bench.py: compile on, the
# preset's batch, sequence length and activation checkpointing), each point both sides in turn:
#   1b    FSDP2 4x2048, AC none            8b    FSDP2 4x2048, AC full
#   1b_fp8, 8b_fp8: the same with FP8 (ours: --set fp8.backend=torchao, the one switch;
#                   torchtitan: --fp8 tensorwise)
# Two more --set on our side, neither a tuning key: train.log_every=1 (a metrics row per step,
# for the median step) and checkpoint.final=false (the 8b end-of-run checkpoint is 96 GB: minutes
# of disk writes, and two of them do not fit the machine's disk).
#
#   POINTS="8b 1b" bash scripts/gpu/defaults_vs_titan.sh          ~8 min on 2xH100
#   POINTS="8b_fp8 1b_fp8" bash scripts/gpu/defaults_vs_titan.sh  ~8 min
# Default POINTS: all four in that order, as far as BUDGET_S (seconds, default 560) allows.
# Carry .titan (titan_bench.py + torchtitan-src, ../shared/tools/titan_bench.md) and .whl
# (torchao). Results in $OUT: defaults.md (printed), defaults.json, and per run NAME.log and
# NAME.metrics.jsonl (ours) or titan_NAME.json. NVLink multicast stays off (common.sh).
set -uo pipefail
# shellcheck source=scripts/gpu/common.sh
source "$(dirname "$0")/common.sh"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-8}"
OUT="${OUT:-runs/gpu-out}"
POINTS="${POINTS:-8b 1b 8b_fp8 1b_fp8}"
BUDGET_S="${BUDGET_S:-560}"
W=/tmp/defaults-vs-titan
rm -rf "$W"
mkdir -p "$W" "$OUT"
TRUN=(python3 -m torch.distributed.run --standalone --nproc-per-node 2)
note() { echo "[defaults_vs_titan $(date +%T)] $*" | tee -a "$OUT/defaults.log"; }
python3 -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count(),
  torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")' 2>&1 | tee -a "$OUT/defaults.log"

left() {  # LIMIT -> min(LIMIT, what is left of BUDGET_S); fails when under 30 s are left
  local rest=$((BUDGET_S - SECONDS))
  if [ "$rest" -lt 30 ]; then return 1; fi
  echo $(($1 < rest ? $1 : rest))
}

ours() {  # NAME CONFIG STEPS LIMIT [--set ...]
  local name=$1 config=$2 steps=$3 limit
  if ! limit=$(left "$4"); then note "$name skipped: BUDGET_S=$BUDGET_S spent"; return; fi
  shift 4
  TORCHINDUCTOR_CACHE_DIR="/tmp/defaults-inductor/$name" timeout -k 10 "$limit" "${TRUN[@]}" -m train run \
    --config "$config" --out "$W/$name" --steps "$steps" --set data.source=synthetic \
    --set train.log_every=1 --set checkpoint.final=false "$@" >"$OUT/$name.log" 2>&1 \
    || note "$name failed (exit $?); see $name.log"
  cp "$W/$name/metrics.jsonl" "$OUT/$name.metrics.jsonl" 2>/dev/null || true
  note "$name done"
}

titan() {  # NAME PRESET AC FP8 STEPS WARMUP LIMIT
  local name=$1 limit
  if ! limit=$(left "$7"); then note "titan_$name skipped: BUDGET_S=$BUDGET_S spent"; return; fi
  if [ ! -f .titan/titan_bench.py ]; then note "titan_$name skipped: no .titan/titan_bench.py (carry .titan)"; return; fi
  PYTHONPATH="$PWD/.titan/torchtitan-src:${PYTHONPATH:-}" TORCHINDUCTOR_CACHE_DIR="/tmp/defaults-inductor/titan_$name" \
    timeout -k 10 "$limit" "${TRUN[@]}" .titan/titan_bench.py --preset "$2" --batch 4 --seq 2048 --compile on \
    --ac "$3" --fp8 "$4" --steps "$5" --warmup "$6" --out "$OUT/titan_$name.json" >"$OUT/titan_$name.log" 2>&1 \
    || note "titan_$name failed (exit $?); see titan_$name.log"
  note "titan_$name done"
}

for point in $POINTS; do
  case "$point" in
    1b) titan 1b 1b none none 15 4 110; ours 1b 1b 15 120 ;;
    1b_fp8) titan 1b_fp8 1b none tensorwise 15 4 110; ours 1b_fp8 1b 15 120 --set fp8.backend=torchao ;;
    8b) titan 8b 8b full none 10 3 130; ours 8b 8b 10 140 ;;
    8b_fp8) titan 8b_fp8 8b full tensorwise 10 3 130; ours 8b_fp8 8b 10 140 --set fp8.backend=torchao ;;
    *) note "unknown point $point (1b, 1b_fp8, 8b, 8b_fp8)" ;;
  esac
done
python3 "$(dirname "$0")/defaults_summary.py" "$OUT" | tee "$OUT/defaults.md"
