#!/usr/bin/env bash
# The training stall per checkpoint, synchronous DCP save vs checkpoint.async_save
# (DCP async_save, pinned-memory staging), on 2 GPUs with FSDP2 + full activation
# checkpointing at the 8b preset's width. Bounded: 2 runs of at most RUN_LIMIT_S (default
# 180 s) each plus ~20 s (< 7 minutes); about 3-4 minutes when nothing goes wrong.
#
#   bash scripts/gpu/async_ckpt.sh          (repo root; results in $OUT/async_ckpt/)
#
# The full 8b's checkpoint (fp32 params + 2 Adam moments = 12 bytes/param, ~96 GB) does not
# fit twice on the GPU machines' disk (a save keeps the previous checkpoint until it
# commits), so the script keeps the 8b width (dim 4096, ffn 14336, vocab, GQA) and takes
# as many of its 32 layers as fit in 25% of the free disk under CKPT_DIR and 40% of the
# available host memory (async staging holds one host copy of every rank's shard).
# The layer count is recorded in the results.
#
# Each mode trains STEPS steps on synthetic tokens, checkpointing every EVERY steps
# (keep=1, no final save); the stall is the time the training loop is blocked in the save
# (sync: the whole write; async: staging to host memory + the small per-rank files).
# Outputs: $OUT/async_ckpt/{sync,async}.log, metrics_{sync,async}.jsonl, results.json, summary.md.
# Checkpoints go to CKPT_DIR (default /tmp/async-ckpt, never under $OUT) and are removed.
#
# CPU dry run of the whole script (what the test suite does):
#   OUT=/tmp/o PRESET=tiny LAYERS=2 NPROC=2 STEPS=6 EVERY=2 \
#     EXTRA="--set train.device=cpu --set train.seq_len=32 --set train.batch_size=4" bash scripts/gpu/async_ckpt.sh
set -euo pipefail
# shellcheck source=scripts/gpu/common.sh
source "$(dirname "$0")/common.sh"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-8}"
OUT="${OUT:-runs/gpu-out}"
D="$OUT/async_ckpt"
CKPT_DIR="${CKPT_DIR:-/tmp/async-ckpt}"
PRESET="${PRESET:-8b}"
LAYERS="${LAYERS:-auto}"
NPROC="${NPROC:-2}"
STEPS="${STEPS:-12}"
EVERY="${EVERY:-5}"
RUN_LIMIT_S="${RUN_LIMIT_S:-180}"
read -r -a EXTRA_ARGS <<< "${EXTRA:-}"
PY=python3
if [ -x .venv/bin/python ] && .venv/bin/python -c 'import torch, click, yaml' >/dev/null 2>&1; then PY=.venv/bin/python; fi
mkdir -p "$D" "$CKPT_DIR"
LOG="$D/log.txt"
: >"$LOG"
note() { echo "[async_ckpt.sh $(date +%T)] $*" | tee -a "$LOG"; }
trap 'rm -rf "${CKPT_DIR:?}/sync" "${CKPT_DIR:?}/async"' EXIT

if [ "$LAYERS" = auto ]; then
  LAYERS=$("$PY" - "$PRESET" "$CKPT_DIR" <<'EOF'
import shutil, sys
import torch
from train.config import load_config
from train.models.llama import Transformer, count_params

job = load_config(sys.argv[1])
def params(n):
    cfg = job.model
    cfg.n_layers = n
    with torch.device("meta"):
        return count_params(Transformer(cfg))
full = job.model.n_layers
base, per_layer = params(1) - (params(2) - params(1)), params(2) - params(1)
disk = shutil.disk_usage(sys.argv[2]).free
mem = next(int(l.split()[1]) * 1024 for l in open("/proc/meminfo") if l.startswith("MemAvailable"))
budget = min(0.25 * disk, 0.4 * mem) / 12.0  # params that fit: 12 bytes each (fp32 param + 2 Adam moments)
print(max(1, min(full, int((budget - base) // per_layer))))
EOF
)
fi
note "preset $PRESET, $LAYERS layer(s), $NPROC processes, $STEPS steps, checkpoint every $EVERY; checkpoints in $CKPT_DIR ($(df -h "$CKPT_DIR" | awk 'NR==2{print $4}') free)"
"$PY" -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")' 2>&1 | tee -a "$LOG" || true

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

for mode in sync async; do
  async=false
  [ "$mode" = async ] && async=true
  rm -rf "${CKPT_DIR:?}/$mode"
  note "run: $mode"
  rc=0
  timeout -k 10 "$RUN_LIMIT_S" "$PY" -m torch.distributed.run --nproc-per-node "$NPROC" --rdzv-backend c10d \
    --rdzv-endpoint "127.0.0.1:$(free_port)" -m train run --config "$PRESET" --steps "$STEPS" \
    --out "$CKPT_DIR/$mode" --set "model.n_layers=$LAYERS" --set data.source=synthetic \
    --set "checkpoint.every=$EVERY" --set checkpoint.keep=1 --set checkpoint.final=false \
    --set "checkpoint.async_save=$async" --set train.log_every=1 --set metrics.progress=false \
    --set train.timeout_s=300 "${EXTRA_ARGS[@]}" >"$D/$mode.log" 2>&1 || rc=$?
  note "$mode: exit $rc"
  cp "$CKPT_DIR/$mode/metrics.jsonl" "$D/metrics_$mode.jsonl" 2>/dev/null || note "$mode: no metrics.jsonl"
  du -sh "$CKPT_DIR/$mode/checkpoints" 2>/dev/null | tee -a "$LOG" || true
  rm -rf "${CKPT_DIR:?}/$mode"
done

"$PY" - "$D" "$PRESET" "$LAYERS" "$NPROC" "$EVERY" <<'EOF' 2>&1 | tee -a "$LOG"
import json, re, statistics, sys
from pathlib import Path

d, preset, layers, nproc, every = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
res = {"preset": preset, "n_layers": layers, "nproc": nproc, "checkpoint_every": every, "modes": {}}
for mode in ("sync", "async"):
    log = (d / f"{mode}.log").read_text(errors="replace") if (d / f"{mode}.log").exists() else ""
    stalls = [float(x) for x in re.findall(r"checkpoint step_\d+: stall ([\d.]+) ms", log)]
    writes = [float(x) for x in re.findall(r"background write ([\d.]+) s", log)]
    rows = []
    mfile = d / f"metrics_{mode}.jsonl"
    if mfile.exists():
        rows = [json.loads(l) for l in mfile.read_text().splitlines() if l.strip()]
    times = {r["step"]: r["step_time_s"] for r in rows}
    after = [times[s + 1] for s in times if s % every == 0 and s + 1 in times]  # the step after a save
    plain = [t for s, t in times.items() if s > 1 and s % every != 1]
    ok = "=== summary ===" in log
    res["modes"][mode] = {
        "completed": ok, "stall_ms": stalls, "background_write_s": writes,
        "step_time_median_s": statistics.median(plain) if plain else None,
        "step_after_save_s": after, "model": (re.findall(r"model \S+: ([\d.]+M) params", log) or [None])[0],
        "strategy": (re.findall(r"strategy (\S+)", log) or ["?"])[0],
    }
(d / "results.json").write_text(json.dumps(res, indent=1))
strategy = res["modes"]["sync"]["strategy"]
lines = [f"# Checkpoint stall: sync vs async ({preset} width, {layers} layers, {nproc} ranks, strategy {strategy}, "
         f"AC as in the {preset} preset)", "",
         "| mode | model | stall per checkpoint (ms, each save) | background write (s) | median step (s) | step after a save (s) |",
         "|---|---|---|---|---|---|"]
for mode, m in res["modes"].items():
    fmt = lambda xs: ", ".join(f"{x:.0f}" if x >= 10 else f"{x:.2f}" for x in xs) or "-"
    med = f"{m['step_time_median_s']:.3f}" if m["step_time_median_s"] else "-"
    lines.append(f"| {mode}{'' if m['completed'] else ' (did not finish)'} | {m['model']} | {fmt(m['stall_ms'])} | "
                 f"{fmt(m['background_write_s'])} | {med} | {fmt(m['step_after_save_s'])} |")
lines += ["", "Stall: time the training loop spent in the save (sync: the whole DCP write; async: staging",
          "to pinned host memory plus the per-rank extra-state file; the first async save also allocates",
          "and pins the staging buffers). Step after a save: its step time, which includes any slowdown",
          "from the background write."]
(d / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
note "done"
