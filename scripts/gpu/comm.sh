#!/usr/bin/env bash
# train/comm on a 2-GPU host: collective bandwidth, NCCL tuning, emulated slow
# links and gradient compression. Run from the repo root on a 2-GPU host (2xH200, NVLink):
#
#     OUT=/some/dir bash scripts/gpu/comm.sh
#
# Results: $OUT/comm/ (JSON + PNG per bench, summary.md, comm.log). Budget: about 3
# minutes of wall time; steps run in priority order and each gets at most what is left
# of COMM_BUDGET_S (default 180; a step that fails or times out is logged and the script
# goes on; a step that no longer fits is skipped and listed as such). PYTHON=... picks
# the interpreter (default: python on PATH).
set -euo pipefail

# SAFETY: no NVLink SHARP / multicast on the shared machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
export PYTHONUNBUFFERED=1

OUT_ROOT=${OUT:-/tmp/out}
RES="$OUT_ROOT/comm"
WORK=$(mktemp -d /tmp/comm_work.XXXXXX)
mkdir -p "$RES"
LOG="$RES/comm.log"
: > "$LOG"
PY=${PYTHON:-$(command -v python || command -v python3)}
NGPU=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
NPROC=${NPROC:-2}
if [ "$NGPU" -lt "$NPROC" ]; then
    echo "comm.sh: needs $NPROC GPUs, found $NGPU" | tee -a "$LOG"
    exit 1
fi
BUDGET=${COMM_BUDGET_S:-180}
T0=$(date +%s)
STATUS=()
STEP_ENV=""

left() { echo $(( BUDGET - ($(date +%s) - T0) )); }

# step NAME MAX_SECONDS MIN_SECONDS ARGS... : run `torchrun ... -m train ARGS` within the budget
step() {
    local name=$1 max=$2 min=$3
    shift 3
    local rem limit t rc
    rem=$(left)
    limit=$(( rem < max ? rem : max ))
    if [ "$limit" -lt "$min" ]; then
        STATUS+=("$name: skipped (budget: ${rem}s left, needs ${min}s)")
        echo "== $name: skipped, ${rem}s of budget left" >> "$LOG"
        return 0
    fi
    echo "== $name (limit ${limit}s): ${STEP_ENV} train $*" >> "$LOG"
    t=$(date +%s)
    rc=0
    # shellcheck disable=SC2086  # STEP_ENV: space-separated VAR=value words
    timeout -k 10 "$limit" env $STEP_ENV "$PY" -m torch.distributed.run --standalone --nproc-per-node "$NPROC" \
        -m train "$@" >> "$LOG" 2>&1 || rc=$?
    STATUS+=("$name: rc=$rc in $(( $(date +%s) - t ))s")
    echo "== $name: rc=$rc in $(( $(date +%s) - t ))s" >> "$LOG"
    return 0
}

# 1. NVLink (NCCL defaults): the full sweep, both dtypes, P2P matrix, raw-loop reference at 1 GiB
step comm_nvlink 75 20 bench comm --dtype float32,bfloat16 --min-bytes 8 --max-bytes 1G \
    --emulate-link nvlink --name comm --out "$WORK"

# 2. Compression on the socket-emulated link (the targets), 350m, bf16
step compression_ethernet 100 60 bench compression --preset 350m --steps 20 --start-iter 3 \
    --emulate-link ethernet --runs-dir "$WORK/runs_eth" --out "$WORK"

# 3. Compression on NVLink: where it costs more than it saves
step compression_nvlink 60 35 bench compression --preset 350m --steps 20 --start-iter 3 \
    --variants none,fp16,powersgd:4,topk:0.01,localsgd:4 --emulate-link nvlink \
    --runs-dir "$WORK/runs_nvl" --out "$WORK"

# 4. NCCL tuning at 1 GiB (documented variables only), one short run each
for spec in "minch32:NCCL_MIN_NCHANNELS=32" "buff16m:NCCL_BUFFSIZE=16777216" "maxch8:NCCL_MAX_NCHANNELS=8"; do
    STEP_ENV=${spec#*:}
    step "tune_${spec%%:*}" 30 15 bench comm --ops all_reduce --min-bytes 1G --max-bytes 1G \
        --iters 40 --no-p2p --name "tune_${spec%%:*}" --out "$WORK"
done
STEP_ENV=""

# 5. The emulated links themselves: all_reduce 1 GiB over host memory and over sockets
step comm_ethernet 30 15 bench comm --ops all_reduce --min-bytes 1G --max-bytes 1G --no-p2p \
    --max-seconds 4 --emulate-link ethernet --out "$WORK"
step comm_pcie 25 12 bench comm --ops all_reduce --min-bytes 1G --max-bytes 1G --no-p2p \
    --emulate-link pcie --out "$WORK"

# Keep a few files: the JSON of every bench, the charts of the main ones.
for f in comm.json comm.png comm_p2p.json comm_pcie.json comm_ethernet.json \
         compression_ethernet.json compression_ethernet.png compression_ethernet.md \
         compression_nvlink.json compression_nvlink.png compression_nvlink.md \
         tune_minch32.json tune_buff16m.json tune_maxch8.json; do
    if [ -f "$WORK/$f" ]; then cp "$WORK/$f" "$RES/"; fi
done

"$PY" - "$RES" > "$RES/summary.md" 2>> "$LOG" <<'PYEOF' || echo "summary failed (see comm.log)" >> "$RES/summary.md"
import json, sys
from pathlib import Path

res = Path(sys.argv[1])

def load(name):
    p = res / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None

print("## all_reduce 1 GiB (float32), busbw GB/s")
print("| run | NCCL env | bench busbw | raw-loop busbw | bench vs raw |")
print("|---|---|---|---|---|")
for name in ("comm", "tune_minch32", "tune_buff16m", "tune_maxch8", "comm_pcie", "comm_ethernet"):
    d = load(name)
    if not d:
        print(f"| {name} | - | missing | | |")
        continue
    ref = d["meta"].get("raw_reference") or {}
    env = {k: v for k, v in (d["meta"].get("nccl_env") or {}).items()} if isinstance(d["meta"].get("nccl_env"), dict) else {}
    env_s = " ".join(f"{k}={v}" for k, v in env.items() if k not in ("NCCL_NVLS_ENABLE",)) or "defaults"
    bench = ref.get("bench_busbw_GBps")
    raw = ref.get("raw_busbw_GBps")
    if bench is None:
        rows = [r for r in d["rows"] if r["op"] == "all_reduce" and r.get("busbw_GBps")]
        bench = rows[-1]["busbw_GBps"] if rows else float("nan")
    print(f"| {name} | {env_s} | {bench:.1f} | {raw if raw is None else f'{raw:.1f}'} | "
          f"{'' if not ref else format(ref['diff_pct'], '+.2f') + '%'} |")
p2p = load("comm_p2p")
if p2p:
    print("\nP2P send/recv GB/s: " + ", ".join(f"{r['src']}->{r['dst']} {r['bw_GBps']:.1f}" for r in p2p["rows"]))
for name in ("compression_ethernet", "compression_nvlink"):
    d = load(name)
    print(f"\n## {name}")
    if not d:
        print("missing")
        continue
    m = d["meta"]
    print(f"model {m.get('model')}, batch {m.get('batch')}, {m.get('steps')} steps, timed {m.get('timed_steps')}, "
          f"link {m.get('emulate_link')}")
    print("| variant | ms/step | speedup | exposed comm ms | MB/step | loss | loss vs none |")
    print("|---|---|---|---|---|---|---|")
    for r in d["rows"]:
        if "error" in r:
            print(f"| {r['variant']} | error: {r['error'][:80]} | | | | | |")
            continue
        print(f"| {r['variant']} | {r['step_ms']:.1f} | {r.get('speedup', float('nan')):.2f}x | "
              f"{r['exposed_comm_ms']:.1f} | {r['MB_per_step']:.1f} | {r['loss']:.4f} | "
              f"{r.get('loss_vs_none_pct', float('nan')):+.2f}% |")
PYEOF

{
    echo
    echo "## steps"
    for s in "${STATUS[@]}"; do echo "- $s"; done
    echo "- total wall: $(( $(date +%s) - T0 ))s (budget ${BUDGET}s)"
} >> "$RES/summary.md"
cat "$RES/summary.md"
rm -rf "$WORK"
