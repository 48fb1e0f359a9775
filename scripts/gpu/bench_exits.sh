#!/usr/bin/env bash
# The benchmarks' exits on GPUs (2 GPUs, ~2 min): `train bench step` whose only point runs out
# of memory (exit 1, one line), `train bench comm` refusing a message larger than this rank's
# GPU before it starts (exit 2 on both ranks), and `train bench compression` on NCCL stopped by
# SIGTERM to torchrun (each rank: one line, the variant cut short kept in the report).
# Everything lands in $OUT/bench_exits.txt and $OUT/compression.json.
set -uo pipefail
# shellcheck source=scripts/gpu/common.sh
source "$(dirname "$0")/common.sh"
R=/tmp/bench-exits
rm -rf "$R" && mkdir -p "$R"
log() { echo "== $*" | tee -a "$R/bench_exits.txt"; }
run() {  # NAME CMD...: run, keep its output, log the exit status and the 'error:' lines
  local name=$1
  shift
  "$@" >"$R/$name.log" 2>&1
  log "$name: exit $?"
  grep -a "error: \|Traceback" "$R/$name.log" | tee -a "$R/bench_exits.txt"
}
TRUN=(python3 -m torch.distributed.run --standalone)

run step_oom env CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m train bench step --device cuda --preset 8b \
  --strategy ddp --batch 16 --seq 4096 --steps 1 --warmup 0 --out "$R/step_oom"
run comm_too_big timeout 120 "${TRUN[@]}" --nproc-per-node 2 -m train bench comm --ops all_reduce \
  --max-bytes 64G --out "$R/comm"

# compression: SIGTERM to torchrun once the first variant has logged 5 steps
timeout 300 "${TRUN[@]}" --nproc-per-node 2 -m train bench compression --preset tiny --steps 100000 \
  --variants none,fp16 --set train.device=cuda --out "$R/cmp" >"$R/cmp.log" 2>&1 &
pid=$!
for _ in $(seq 240); do
  m=$R/cmp/compression_runs/none/metrics.jsonl
  [ -f "$m" ] && [ "$(wc -l <"$m")" -ge 5 ] && break
  sleep 0.5
done
kill -TERM "$pid"
wait "$pid"
log "compression_sigterm: torchrun exit $? (its own SignalException after the workers exit)"
grep -a "error: \|SIGTERM" "$R/cmp.log" | tee -a "$R/bench_exits.txt"
cp "$R/cmp/compression.json" "$OUT/" 2>/dev/null || log "no compression.json"
cp "$R/bench_exits.txt" "$OUT/"
tar -czf "$OUT/bench_exits.tgz" -C "$R" --exclude='checkpoints' .
