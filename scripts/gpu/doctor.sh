#!/usr/bin/env bash
# `train doctor` on a 2-GPU host: the setup report on a real GPU host, and the
# memory estimator (train/memory.py) against torch.cuda.max_memory_allocated of real
# training steps. Run from the repo root on a 2-GPU host (2xH200, NVLink):
#
#     OUT=/some/dir bash scripts/gpu/doctor.sh
#
# Results in $OUT/doctor/:
#   doctor_1b.json   `train doctor --json --check-nccl --measure` (1b, seq 2048, batch 2):
#                    versions, GPUs, P2P/topology, torchao/TE, NCCL self-test, estimates,
#                    and 3 measured steps on GPU 0 without and with full AC
#   compare.json     estimate vs measured peak for 1 GPU (no AC / full AC), DDP x2, FSDP2 x2
#   doctor.log       stderr of every step
# Budget: about 60 s of wall time (each step is bounded; a failed step is logged and the
# script goes on).
set -euo pipefail

# SAFETY: no NVLink SHARP / multicast on the shared machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
export PYTHONUNBUFFERED=1

RES="${OUT:-/tmp/out}/doctor"
WORK=$(mktemp -d /tmp/doctor_work.XXXXXX)
mkdir -p "$RES"
LOG="$RES/doctor.log"
: > "$LOG"
PY=${PYTHON:-$(command -v python || command -v python3)}
T0=$(date +%s)
STATUS=()

note() { STATUS+=("$1"); echo "== $1" >> "$LOG"; }

# 1. The report + single-GPU measurements (exit 1 means it found a problem: still recorded).
t=$(date +%s); rc=0
timeout -k 5 40 "$PY" -m train doctor --json --check-nccl --measure --preset 1b --seq 2048 --batch 2 \
    > "$RES/doctor_1b.json" 2>> "$LOG" || rc=$?
note "doctor --json --check-nccl --measure (1b): rc=$rc in $(( $(date +%s) - t ))s"

# 2./3. Two-GPU runs of the real trainer: peak memory of rank 0 from metrics.jsonl.
run2() {  # run2 NAME EXTRA_SET...
    local name=$1; shift
    local t rc=0 sets=()
    for kv in "$@"; do sets+=(--set "$kv"); done
    t=$(date +%s)
    timeout -k 5 40 "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 -m train run --config 1b \
        --steps 3 --out "$WORK/$name" --set data.source=synthetic --set train.batch_size=2 \
        --set train.seq_len=2048 --set checkpoint.final=false --set metrics.progress=false "${sets[@]}" \
        >> "$LOG" 2>&1 || rc=$?
    note "train run 1b x2 $name: rc=$rc in $(( $(date +%s) - t ))s"
}
run2 ddp parallel.strategy=ddp
run2 fsdp parallel.strategy=fsdp parallel.dp_replicate=1 parallel.dp_shard=-1

# Summary: estimate vs measured.
"$PY" - "$RES" "$WORK" <<'EOF' 2>> "$LOG" || note "summary failed (see doctor.log)"
import json, sys
from pathlib import Path
import torch
from train.memory import GiB, Plan, estimate, norm_fp32_in_autocast
from train.models.presets import MODEL_PRESETS

res, work = Path(sys.argv[1]), Path(sys.argv[2])
cfg, seq, batch = MODEL_PRESETS["1b"], 2048, 2
rows = []
try:
    report = json.loads((res / "doctor_1b.json").read_text())
    gpus = ", ".join(f"{g['name']} sm_{g['sm'][3:]}" for g in report["gpus"])
    ao = report["libraries"]["torchao"]
    print(f"doctor: exit {report['exit_code']}, GPUs: {gpus or 'none'}, NCCL {report['versions']['nccl']}, "
          f"self-test {report['nccl']['selftest']}, torchao {ao['version']} (C++ extensions: {ao['cpp_extensions']})")
    for p in report["problems"]:
        print(f"  PROBLEM: {p}")
    for m in report["memory"].get("measured", []):
        rows.append({"config": f"1 GPU, ac={m['ac']}", "measured": m.get("measured_bytes"),
                     "estimate": m.get("estimate_bytes"), "error": m.get("error"),
                     "failed": m.get("failed") or m.get("skipped")})
except Exception as exc:
    print(f"doctor_1b.json unreadable: {exc}")
nf = norm_fp32_in_autocast(torch.__version__)
for name, plan in (("ddp", Plan("ddp", 2, norm_fp32=nf)), ("fsdp", Plan("fsdp", 2, norm_fp32=nf))):
    est = estimate(cfg, batch, seq, plan).peak
    path = work / name / "metrics.jsonl"
    if not path.is_file():
        rows.append({"config": f"{plan.label} x2", "measured": None, "estimate": est, "error": None,
                     "failed": "no metrics"})
        continue
    last = [json.loads(line) for line in path.read_text().splitlines() if line.strip()][-1]
    measured = int(last["peak_mem_gib"] * GiB)
    rows.append({"config": f"{plan.label} x2", "measured": measured, "estimate": est,
                 "error": (est - measured) / measured if measured else None})
(res / "compare.json").write_text(json.dumps({"preset": "1b", "seq": seq, "batch": batch, "rows": rows}, indent=2))
print(f"{'config (1b, seq 2048, batch 2)':32s} {'measured GiB':>12s} {'estimate GiB':>12s} {'error':>8s}")
for r in rows:
    f = lambda x: f"{x / GiB:12.2f}" if x else f"{'-':>12s}"
    err = f"{r['error'] * 100:+7.1f}%" if r.get("error") is not None else f"{r.get('failed') or '-':>8s}"
    print(f"{r['config']:32s} {f(r['measured'])} {f(r['estimate'])} {err}")
EOF

rm -rf "$WORK"
echo "---- doctor.sh: $(( $(date +%s) - T0 ))s"
for s in "${STATUS[@]}"; do echo "  $s"; done
