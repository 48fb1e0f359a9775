#!/usr/bin/env bash
# A real slow link between two GPUs of one host: each rank in its own network namespace,
# the two joined by one veth shaped with tc (tbf, plus netem delay where the kernel has
# it), NCCL forced onto sockets across it. Then: `train bench comm` (all_reduce busbw and
# the none/LocalSGD/PowerSGD recommendation) unshaped, at 25 and at 10 Gbit/s, and
# `train bench compression` at 10 Gbit/s (uncompressed vs PowerSGD r=4 (ours and torch's
# hook), LocalSGD 4; then PowerSGD r=8, Top-K 1% and PowerSGD r=1 as time allows), loss after the
# same number of steps.
#
#     OUT=/some/dir bash scripts/gpu/slowlink.sh        # repo root, root user, 2 GPUs
#
# Needs pyroute2 (no iproute2 on the GPU hosts): carried as a wheel in .whl/, which
# common.sh installs. Results in $OUT/slowlink/: summary.md (report-ready), slowlink.log,
# comm_{unshaped,25gbit,10gbit}.json, compression_10gbit{,_more}.json. Budget: SLOWLINK_BUDGET_S
# (default 480 s); each step gets what is left (a step that no longer fits is skipped and
# listed). The namespaces are removed on exit, also on failure or Ctrl-C.
#
# The same script runs on a CPU machine (gloo, tiny preset) for testing:
#     SLOWLINK_CPU=1 SLOWLINK_PRESET=tiny SLOWLINK_STEPS=12 ... bash scripts/gpu/slowlink.sh
# (tests/comm/test_slowlink_script.py).
set -euo pipefail
# shellcheck source=scripts/gpu/common.sh
source "$(dirname "$0")/common.sh"   # NVLink multicast off, unbuffered Python, carried wheels

OUT_ROOT=${OUT:-/tmp/out}
RES="$OUT_ROOT/slowlink"
mkdir -p "$RES"
LOG="$RES/slowlink.log"
: > "$LOG"
WORK=$(mktemp -d /tmp/slowlink.XXXXXX)
PY=${PYTHON:-$(command -v python3 || command -v python)}
PREFIX=${SLOWLINK_PREFIX:-hpt}
LINK=hptlink
BUDGET=${SLOWLINK_BUDGET_S:-480}
STEPS=${SLOWLINK_STEPS:-100}
PRESET=${SLOWLINK_PRESET:-350m}
START=${SLOWLINK_START_ITER:-5}
DELAY_US=${SLOWLINK_DELAY_US:-50}
RATES=${SLOWLINK_RATES:-"none 25gbit 10gbit"}
BENCH_RATE=${SLOWLINK_BENCH_RATE:-10gbit}
VARIANTS=${SLOWLINK_VARIANTS-none,powersgd:4,powersgd-torch:4,localsgd:4}  # empty: skip this step
MORE_VARIANTS=${SLOWLINK_MORE_VARIANTS-powersgd:8,topk:0.01,powersgd:1}  # empty: skip this step
MAX_BYTES=${SLOWLINK_MAX_BYTES:-1G}
EXTRA_SET=${SLOWLINK_SET:-}   # e.g. "train.batch_size=2 train.seq_len=64" (space-separated KEY=VALUE)
CPU=${SLOWLINK_CPU:-0}
T0=$(date +%s)
STATUS=()
PORT=29610

cleanup() {
    "$PY" scripts/netns_pair.py down --prefix "$PREFIX" >> "$LOG" 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$CPU" = 1 ]; then
    BACKEND=gloo
else
    NGPU=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
    if [ "$NGPU" -lt 2 ]; then
        echo "slowlink.sh: needs 2 GPUs, found $NGPU (SLOWLINK_CPU=1 for the CPU variant)" | tee -a "$LOG"
        exit 1
    fi
    BACKEND=nccl
fi
# NCCL across the veth only: no peer-to-peer, no shared memory, no InfiniBand; sockets on
# the namespace's veth ("=" = exact interface name). Gloo (CPU variant, and torch's own
# store traffic) on the same interface.
export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME="=$LINK"
export GLOO_SOCKET_IFNAME=$LINK OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}

left() { echo $(( BUDGET - ($(date +%s) - T0) )); }

# pair NAME MAX_SECONDS MIN_SECONDS ARGS... : `train ARGS` as a 2-node torchrun, node i in namespace PREFIXi
pair() {
    local name=$1 max=$2 min=$3 rem limit t i rc=0
    shift 3
    rem=$(left)
    limit=$(( rem < max ? rem : max ))
    if [ "$limit" -lt "$min" ]; then
        STATUS+=("$name: skipped (budget: ${rem}s left, needs ${min}s)")
        echo "== $name: skipped, ${rem}s of budget left" >> "$LOG"
        return 0
    fi
    PORT=$(( PORT + 1 ))
    echo "== $name (limit ${limit}s): train $*" >> "$LOG"
    t=$(date +%s)
    local pids=()
    for i in 0 1; do
        timeout -k 10 "$limit" "$PY" scripts/netns_pair.py exec "$PREFIX$i" -- \
            env CUDA_VISIBLE_DEVICES="$i" "$PY" -m torch.distributed.run --nnodes 2 --node-rank "$i" \
            --nproc-per-node 1 --master-addr 10.77.0.1 --master-port "$PORT" -m train "$@" \
            > "$WORK/$name.node$i.log" 2>&1 &
        pids+=($!)
    done
    for i in 0 1; do
        wait "${pids[$i]}" || rc=$?
    done
    cat "$WORK/$name.node0.log" >> "$LOG"
    if [ "$rc" != 0 ]; then
        { echo "-- $name node1 (tail):"; tail -20 "$WORK/$name.node1.log"; } >> "$LOG"
    fi
    STATUS+=("$name: rc=$rc in $(( $(date +%s) - t ))s")
    echo "== $name: rc=$rc in $(( $(date +%s) - t ))s" >> "$LOG"
    return 0
}

sets=()
for kv in $EXTRA_SET; do sets+=(--set "$kv"); done

{
    echo "== $(date -u +%FT%TZ) $(hostname) backend=$BACKEND preset=$PRESET steps=$STEPS budget=${BUDGET}s"
    if [ "$CPU" != 1 ]; then nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; fi
    "$PY" -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else "-")'
    "$PY" -c 'import pyroute2; print("pyroute2", pyroute2.__version__)'
} >> "$LOG" 2>&1
"$PY" scripts/netns_pair.py up --prefix "$PREFIX" --rate none > "$RES/link.json" 2>> "$LOG"

for rate in $RATES; do
    "$PY" scripts/netns_pair.py shape --prefix "$PREFIX" --rate "$rate" --delay-us "$([ "$rate" = none ] && echo 0 || echo "$DELAY_US")" \
        > "$WORK/shape_$rate.json" 2>> "$LOG"
    echo "== shaping $rate: $(cat "$WORK/shape_$rate.json")" >> "$LOG"
    label=$([ "$rate" = none ] && echo unshaped || echo "$rate")
    pair "comm_$label" 60 20 bench comm --backend "$BACKEND" --ops all_reduce --min-bytes 1M --max-bytes "$MAX_BYTES" \
        --factor 4 --no-p2p --recommend --name "comm_$label" --out "$RES"
done

"$PY" scripts/netns_pair.py shape --prefix "$PREFIX" --rate "$BENCH_RATE" --delay-us "$DELAY_US" > /dev/null 2>> "$LOG"
[ -z "$VARIANTS" ] || pair "compression_$BENCH_RATE" 330 60 bench compression --preset "$PRESET" --steps "$STEPS" --start-iter "$START" \
    --loss-window 10 --variants "$VARIANTS" --runs-dir "$WORK/runs" --out "$WORK" --name "compression_$BENCH_RATE" \
    "${sets[@]}"
[ -z "$MORE_VARIANTS" ] || pair "compression_${BENCH_RATE}_more" 200 45 bench compression --preset "$PRESET" --steps "$STEPS" --start-iter "$START" \
    --loss-window 10 --variants "$MORE_VARIANTS" --runs-dir "$WORK/runs_more" --out "$WORK" \
    --name "compression_${BENCH_RATE}_more" "${sets[@]}"
for f in "compression_$BENCH_RATE.json" "compression_${BENCH_RATE}_more.json"; do
    if [ -f "$WORK/$f" ]; then cp "$WORK/$f" "$RES/"; fi
done
rm -f "$RES"/*.md.tmp "$RES"/comm_*.md "$RES"/comm_*.png

"$PY" - "$RES" "$BENCH_RATE" > "$RES/summary.md" 2>> "$LOG" <<'PYEOF' || echo "summary failed (see slowlink.log)" >> "$RES/summary.md"
import json, sys
from pathlib import Path

res, rate = Path(sys.argv[1]), sys.argv[2]

def load(name):
    p = res / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None

link = load("link") or {}
print("# Slow link: two network namespaces, one shaped veth, NCCL over sockets\n")
print(f"veth `{link.get('link')}` {link.get('addresses')}; NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 "
      "NCCL_SOCKET_IFNAME==hptlink; shaping: tbf on both ends (+ netem delay where available, see slowlink.log)\n")
print("## all_reduce busbw over the link (train bench comm) and the recommendation (train/comm/advice.py)\n")
print("| link | largest size | busbw GB/s | rho | recommended |")
print("|---|---|---|---|---|")
for label in ("unshaped", "25gbit", "10gbit", "100mbit", "800mbit"):
    d = load(f"comm_{label}")
    if not d:
        continue
    rows = [r for r in d["rows"] if r["op"] == "all_reduce" and r.get("busbw_GBps")]
    rec = d.get("recommendation") or {}
    if rows:
        print(f"| {label} | {rows[-1]['size']} | {rows[-1]['busbw_GBps']:.3f} | {rec.get('rho', float('nan')):.3g} | "
              f"{' '.join(rec.get('overrides', [])) or '-'} |")
rows, base, commands = [], None, []
for name in (f"compression_{rate}", f"compression_{rate}_more"):
    d = load(name)
    if not d:
        continue
    meta = d["meta"]
    commands.append(meta.get("command"))
    if meta.get("partial"):
        print(f"\n(`{name}` stopped at its time limit: {meta['partial']} finished)")
    for r in d["rows"]:
        rows.append(r)
        if r["variant"] == "none" and r.get("step_ms"):
            base = r
if rows:
    print(f"\n## train bench compression at {rate}: {meta.get('model')}, batch {meta.get('batch')}, "
          f"{meta.get('steps')} steps, timed {meta.get('timed_steps')}, loss = {meta.get('loss')}\n")
    print("| variant | ms/step | speed-up | exposed comm ms | MB/step | loss | loss vs none |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r or not r.get("step_ms"):
            print(f"| {r['variant']} | error: {r.get('error', '?')[:80]} | | | | | |")
            continue
        sp = base["step_ms"] / r["step_ms"] if base else float("nan")
        dl = 100 * (r["loss"] / base["loss"] - 1) if base else float("nan")
        r["_sp"], r["_dl"] = sp, dl
        print(f"| {r['variant']} | {r['step_ms']:.1f} | {sp:.2f}x | {r['exposed_comm_ms']:.1f} | "
              f"{r['MB_per_step']:.2f} | {r['loss']:.4f} | {dl:+.2f}% |")
    ps = [r for r in rows if r["variant"].startswith("powersgd r=") and "_sp" in r]
    if ps and base:
        best = max(ps, key=lambda r: r["_sp"] if abs(r["_dl"]) <= 3 else -1)
        ok = best["_sp"] >= 3 and abs(best["_dl"]) <= 3
        print(f"\nGoal (PowerSGD >= 3x at loss within 3% of uncompressed): {'MET' if ok else 'NOT MET'} "
              f"(best: {best['variant']} {best['_sp']:.2f}x, loss {best['_dl']:+.2f}%)")
    if base:
        compute = base["step_ms"] - base["exposed_comm_ms"]
        for r in ps:
            k = (r["step_ms"] - r["exposed_comm_ms"] - compute) / compute
            print(f"- {r['variant']}: compression compute overhead K = {k:.2f} of the step's compute "
                  f"({compute:.1f} ms) -> train/comm/advice.py COMPUTE_OVERHEAD (GPU runs only: on CPU, "
                  "communication threads share the cores with compute)")
    print("\nMade by `OUT=... bash scripts/gpu/slowlink.sh`; the bench commands (run as a 2-node torchrun, "
          "one node per namespace):")
    for c in commands:
        print(f"- `{c}`")
PYEOF
{
    echo
    echo "## steps"
    for s in "${STATUS[@]}"; do echo "- $s"; done
    echo "- total wall: $(( $(date +%s) - T0 ))s (budget ${BUDGET}s)"
} >> "$RES/summary.md"
cat "$RES/summary.md"
