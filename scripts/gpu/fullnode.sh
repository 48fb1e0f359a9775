#!/usr/bin/env bash
# Issue 17: full-node validation on 4 and 8 H200 GPUs (also runs, smaller, on 2 GPUs as a dry run).
#
#   PART=scale  bash scripts/gpu/fullnode.sh   # 1b/8b FSDP2 per-GPU tokens/s at 1,2,4,8 GPUs (+ torchtitan side)
#   PART=mesh   bash scripts/gpu/fullnode.sh   # 8b meshes TP2xDP4, TP4xDP2, HSDP 2x4, DP8: tok/s, memory,
#                                              # 100-step loss on the embedded text; doctor's recommendation
#   PART=comm   bash scripts/gpu/fullnode.sh   # bench comm (4 collectives, 8 B..1 GiB, raw loop) + elastic kill
#
# Each part is sized for one device call (< 10 min on 8 GPUs). GPU counts above the visible
# count are skipped, so on a 2-GPU machine each part runs its 1- and 2-GPU points only.
# The torchtitan side runs when .titan/ holds the shared harness (../shared/tools/titan_bench.md
# says how to set it up; name .titan and .whl in `carry`).
# Results: $OUT/fullnode/<part>/{*.json,*.md,*.log} and summary.md. NVLink multicast stays off.
set -euo pipefail
# shellcheck source=scripts/gpu/common.sh
source "$(dirname "$0")/common.sh"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-8}"
PART="${PART:-scale}"
OUT="${OUT:-runs/gpu-out}"
D="$OUT/fullnode/$PART"
mkdir -p "$D"
LOG="$D/log.txt"
: >"$LOG"
note() { echo "[fullnode.sh $(date +%T)] $*" | tee -a "$LOG"; }
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "$NGPU" -ge 1 ] || { note "no GPU visible: nothing to do"; exit 0; }
note "part=$PART gpus=$NGPU"
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), torch.cuda.get_device_name(0))' 2>&1 | tee -a "$LOG"
TRUN=(python3 -m torch.distributed.run --standalone)
devices() { seq -s, 0 $(($1 - 1)); }
counts() { for n in "$@"; do [ "$n" -le "$NGPU" ] && echo "$n"; done; true; }

# ours N NAME LIMIT ARGS... : train bench step on the first N GPUs
ours() {
  local n=$1 name=$2 limit=$3
  shift 3
  CUDA_VISIBLE_DEVICES=$(devices "$n") timeout -k 10 "$limit" "${TRUN[@]}" --nproc-per-node "$n" -m train bench step \
    --device cuda --timeout-s 300 --out "$D" --name "$name" "$@" >"$D/$name.log" 2>&1 || note "$name failed (exit $?)"
}
# titan N NAME LIMIT ARGS... : the shared torchtitan harness, same flags
titan() {
  local n=$1 name=$2 limit=$3
  shift 3
  [ -f .titan/titan_bench.py ] || { note "$name skipped: .titan/ not carried"; return 0; }
  PYTHONPATH="$PWD/.titan/torchtitan-src:${PYTHONPATH:-}" CUDA_VISIBLE_DEVICES=$(devices "$n") timeout -k 10 "$limit" \
    "${TRUN[@]}" --nproc-per-node "$n" .titan/titan_bench.py "$@" --out "$D/$name.json" >"$D/$name.log" 2>&1 \
    || note "$name failed (exit $?)"
}

case "$PART" in
scale)
  for n in $(counts 1 2 4 8); do
    note "1b FSDP2 on $n GPU(s)"
    ours "$n" "ours_1b_g$n" 240 --preset 1b --strategy fsdp --compile on --ac none --batch 8 --seq 2048 --steps 15 --warmup 4
    titan "$n" "titan_1b_g$n" 240 --preset 1b --batch 8 --seq 2048 --compile on --ac none --fp8 none --steps 15 --warmup 4
  done
  for n in $(counts 2 4 8); do
    note "8b FSDP2 + AC full on $n GPUs"
    ours "$n" "ours_8b_g$n" 300 --preset 8b --strategy fsdp --compile on --ac full --batch 4 --seq 2048 --steps 10 --warmup 3
    titan "$n" "titan_8b_g$n" 300 --preset 8b --batch 4 --seq 2048 --compile on --ac full --fp8 none --steps 10 --warmup 3
  done
  ;;
mesh)
  n=$NGPU
  [ "$n" -ge 8 ] || note "fewer than 8 GPUs: meshes sized for $n"
  cat >"$D/plan.yaml" <<EOF
# DP=$n (FSDP2), HSDP (2 replicas x $((n / 2)) shards), TP=2 x DP, TP=4 x DP: same global batch of
# $((4 * n)) sequences per step, 100 steps on the embedded text, same seed.
- {preset: 8b, strategy: "fsdp,hsdp", compile: "on", ac: full, batch: 4, seq: 2048, steps: 100, warmup: 0,
   data: embedded, set: [optim.warmup_steps=10, train.log_every=10]}
- {preset: 8b, strategy: fsdp_tp, compile: "on", ac: full, batch: 8, seq: 2048, steps: 100, warmup: 0,
   data: embedded, set: [optim.warmup_steps=10, train.log_every=10]}
EOF
  if [ "$n" -ge 4 ]; then
    cat >>"$D/plan.yaml" <<EOF
- {preset: 8b, strategy: fsdp_tp, compile: "on", ac: full, batch: 16, seq: 2048, steps: 100, warmup: 0,
   data: embedded, set: [parallel.tp=4, optim.warmup_steps=10, train.log_every=10]}
EOF
  fi
  note "8b meshes on $n GPUs (plan.yaml)"
  ours "$n" "mesh_8b_g$n" 570 --plan "$D/plan.yaml"
  python3 -m train doctor --preset 8b --gpus "$n" --profile h200 --json >"$D/doctor_8b_g$n.json" 2>>"$LOG" \
    || note "doctor failed"
  ;;
comm)
  n=$NGPU
  note "bench comm on $n GPUs"
  timeout -k 10 300 "${TRUN[@]}" --nproc-per-node "$n" -m train bench comm \
    --ops all_reduce,all_gather,reduce_scatter,all_to_all --min-bytes 8 --max-bytes 1G --no-p2p --raw \
    --out "$D" --name "comm_g$n" >"$D/comm_g$n.log" 2>&1 || note "bench comm failed (exit $?)"
  note "elastic kill at $n GPUs"
  OUT="$D" FAULT_NPROC="$n" PHASES=kill timeout -k 10 240 bash scripts/gpu/fault.sh >"$D/fault.log" 2>&1 \
    || note "fault kill failed (exit $?)"
  ;;
*) note "unknown PART=$PART (scale, mesh, comm)"; exit 2 ;;
esac

# summary: every JSON report's rows as one table
python3 - "$D" <<'EOF' 2>&1 | tee "$D/summary.md" || true
import json, sys
from pathlib import Path
d = Path(sys.argv[1])
print(f"# {d.name}\n")
print("| file | preset | strategy | mesh | gpus | status | tok/s/GPU | MFU | peak GiB | first/final loss |")
print("|---|---|---|---|---|---|---|---|---|---|")
for p in sorted(d.glob("*.json")):
    try:
        data = json.loads(p.read_text())
    except Exception as exc:
        print(f"| {p.name} | unreadable: {exc} |"); continue
    rows = data.get("rows") if isinstance(data, dict) else None
    for r in rows or [data]:
        if not isinstance(r, dict):
            continue
        get = lambda k, f="{}": (f.format(r[k]) if r.get(k) is not None else "-")
        print(f"| {p.stem} | {get('preset')} | {get('strategy')} | {get('mesh')} | {get('gpus')} | {get('status')} | "
              f"{get('tokens_per_s_per_gpu', '{:,.0f}')} | {get('mfu', '{:.3f}')} | {get('peak_mem_gib', '{:.1f}')} | "
              f"{get('first_loss', '{:.3f}')}/{get('final_loss', '{:.3f}')} |")
EOF
note "done"
