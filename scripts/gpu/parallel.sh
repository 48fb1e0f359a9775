#!/usr/bin/env bash
# Parallel strategies, AC, compile, FP8 on a 2-GPU Hopper node: ~4-5 min wall.
#
#   bash scripts/gpu/parallel.sh            (from the repo root; results in $OUT/parallel/)
#
# 1. one GPU each, concurrently (torchrun --nproc 1, FSDP2 world 1): 1b (batch 8) and 3b
#    (batch 4), seq 2048, compile on: bf16 on GPU 0, FP8 tensorwise (torchao) on GPU 1 ->
#    MFU, FP8/bf16 ratios, the 1-GPU reference for FSDP scaling, a cold Inductor compile.
# 2. both GPUs, one torchrun launch running a plan (train bench step --plan):
#    1b FSDP compile on (same per-GPU batch: 2-vs-1 GPU scaling; warm compile cache),
#    1b DDP/FSDP x AC none/full (batch 8; AC full also batch 4), eager (memory ratios),
#    8b FSDP + full AC + compile (a few steps on real text),
#    125m DDP / HSDP / TP=2 on real text, 30 steps, same seed (loss curves),
#    125m smoke points: FSDP + FP8 (float8 all-gather), TP + FP8, FSDP + CPU offload,
#    FSDP + TP + op-level AC + loss parallel.
# 3. summary.md: the targets next to the measured numbers.
# Every step is time-boxed; a failing one is logged and the script goes on.
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-8}"
OUT="${OUT:-runs/gpu-out}"
D="$OUT/parallel"
mkdir -p "$D"
LOG="$D/log.txt"
: >"$LOG"
note() { echo "[parallel.sh $(date +%T)] $*" | tee -a "$LOG"; }

PY=python3
if [ -x .venv/bin/python ] && .venv/bin/python -c 'import torch, click, yaml' >/dev/null 2>&1; then PY=.venv/bin/python; fi
if ! "$PY" -c 'import torchao' >/dev/null 2>&1 && [ -d .whl ] && ls .whl/torchao-*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-parallel .whl/torchao-*.whl \
    >>"$LOG" 2>&1 || note "torchao install from .whl failed"
  export PYTHONPATH="/tmp/site-parallel${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PY" - <<'EOF' 2>&1 | tee -a "$LOG" || true
import torch
try:
    import torchao; ao = torchao.__version__
except Exception as e:
    ao = f"missing ({type(e).__name__})"
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-", "torchao", ao)
EOF
TRUN=("$PY" -m torch.distributed.run --standalone)
COMMON=(--device cuda --timeout-s 300)

# ---------------------------------------------------------------- 1. one GPU each
note "step 1: 1b and 3b on one GPU, bf16 (GPU 0) and FP8 tensorwise (GPU 1), compile on"
cat >"$D/plan_single.yaml" <<'EOF'
- {preset: 1b, batch: 8}
- {preset: 3b, batch: 4}
EOF
single() {  # name gpu fp8
  CUDA_VISIBLE_DEVICES="$2" timeout 200 "${TRUN[@]}" --nproc-per-node 1 -m train bench step "${COMMON[@]}" \
    --plan "$D/plan_single.yaml" --strategy fsdp --fp8 "$3" --compile on --seq 2048 --steps 15 --warmup 4 \
    --out "$D" --name "$1" >"$D/$1.log" 2>&1 || note "$1 failed (exit $?); see $1.log"
}
single single_bf16 0 none &
single single_fp8 1 tensorwise &
wait
note "step 1 done"

# ---------------------------------------------------------------- 2. both GPUs
cat >"$D/plan.yaml" <<'EOF'
# 2-vs-1 GPU scaling: same config and per-GPU batch as single_bf16 (compiled graph cached)
- {preset: 1b, strategy: fsdp, compile: "on", ac: none, batch: 8, seq: 2048, steps: 10, warmup: 3}
# memory: DDP vs FSDP2 (same AC) and AC full vs none; eager, so nothing to compile
- {preset: 1b, strategy: "fsdp,ddp", compile: "off", ac: "none,full", batch: 8, seq: 2048, steps: 5, warmup: 2}
# the same with half the batch: how the ratio moves as model state's share grows
- {preset: 1b, strategy: "fsdp,ddp", compile: "off", ac: full, batch: 4, seq: 2048, steps: 3, warmup: 1}
# 8b trains on 2 GPUs with FSDP2 + full AC (real text: the loss must fall within 6 steps)
- {preset: 8b, strategy: fsdp, compile: "on", ac: full, batch: 4, seq: 2048, steps: 4, warmup: 2, data: embedded,
   set: [optim.warmup_steps=2]}
# loss curves on real text, same seed, same 16 sequences per step: DDP and HSDP (2 replicas x 1
# shard) read 8 per rank, TP=2 (one data-parallel group) reads all 16
- {preset: 125m, strategy: "ddp,hsdp", data: embedded, compile: "off", ac: none, batch: 8, seq: 1024,
   steps: 30, warmup: 0, set: [optim.lr=0.001, optim.warmup_steps=5]}
- {preset: 125m, strategy: tp, data: embedded, compile: "off", ac: none, batch: 16, seq: 1024,
   steps: 30, warmup: 0, set: [optim.lr=0.001, optim.warmup_steps=5]}
# smoke: FP8 with FSDP2 (float8 all-gather + scale precompute) and with TP (float8 TP styles)
- {preset: 125m, strategy: "fsdp,tp", fp8: tensorwise, data: embedded, compile: "off", batch: 8, seq: 1024,
   steps: 10, warmup: 0, set: [optim.lr=0.001, optim.warmup_steps=5]}
# smoke: FSDP2 + CPU offload; FSDP + TP + op-level AC + loss parallel
- {preset: 125m, strategy: fsdp, compile: "off", batch: 4, seq: 1024, steps: 3, warmup: 1,
   set: [parallel.cpu_offload=true]}
- {preset: 125m, strategy: tp, ac: op, compile: "off", batch: 8, seq: 1024, steps: 3, warmup: 1,
   set: [parallel.loss_parallel=true]}
EOF
note "step 2: plan on 2 GPUs"
timeout 180 "${TRUN[@]}" --nproc-per-node 2 -m train bench step "${COMMON[@]}" --plan "$D/plan.yaml" \
  --out "$D" --name two_gpu >"$D/two_gpu.log" 2>&1 || note "two_gpu failed (exit $?); see two_gpu.log"
note "step 2 done"

# ---------------------------------------------------------------- 3. summary
"$PY" - "$D" <<'EOF' 2>&1 | tee -a "$LOG" || true
import json, sys
from pathlib import Path

d = Path(sys.argv[1])
def rows(name):
    p = d / f"{name}.json"
    return json.loads(p.read_text())["rows"] if p.is_file() else []
def find(rs, **kw):
    for r in rs:
        if all(str(r.get(k)) == str(v) for k, v in kw.items()):
            return r
    return {"status": "missing"}
def ok(*rs): return all(r.get("status") == "ok" for r in rs)
def status(*rs): return " / ".join(str(r.get("status")) for r in rs)

s_bf16, s_fp8, two = rows("single_bf16"), rows("single_fp8"), rows("two_gpu")
b, q = find(s_bf16, preset="1b"), find(s_fp8, preset="1b")
fs = find(two, preset="1b", strategy="fsdp", compile="on")
mem = {(st, ac, bs): find(two, preset="1b", strategy=st, compile="off", ac=ac, batch=bs)
       for st in ("ddp", "fsdp") for ac in ("none", "full") for bs in (8, 4)}
big = find(two, preset="8b")
ref = find(two, preset="125m", strategy="ddp")
lines = ["| measurement | target | measured | detail |", "|---|---|---|---|"]

def add(what, target, measure):
    try:
        value, detail = measure()
    except Exception as exc:  # a missing number is reported, not fatal
        value, detail = "n/a", f"{type(exc).__name__}: {exc}"
    lines.append(f"| {what} | {target} | {value} | {detail} |")

add("1b bf16+compile, 1 GPU: MFU", ">= 50%", lambda: (f"{b['mfu'] * 100:.1f}%",
    f"{b['tokens_per_s']:,.0f} tok/s, step {b['step_ms']:.0f} ms, warm-up incl. cold compile {b['warmup_s']:.0f} s")
    if ok(b) else ("n/a", status(b)))
add("FP8 tensorwise / bf16 tokens/s (1b, 1 GPU)", ">= 1.3x", lambda: (f"{q['tokens_per_s'] / b['tokens_per_s']:.2f}x",
    f"fp8 {q['tokens_per_s']:,.0f} tok/s; final loss fp8 {q['final_loss']:.3f}, bf16 {b['final_loss']:.3f}")
    if ok(b, q) else ("n/a", status(q, b)))
b3, q3 = find(s_bf16, preset="3b"), find(s_fp8, preset="3b")
add("FP8 tensorwise / bf16 tokens/s (3b, 1 GPU, batch 4)", "(info)", lambda: (f"{q3['tokens_per_s'] / b3['tokens_per_s']:.2f}x",
    f"fp8 {q3['tokens_per_s']:,.0f} vs bf16 {b3['tokens_per_s']:,.0f} tok/s; bf16 MFU {b3['mfu'] * 100:.1f}%")
    if ok(b3, q3) else ("n/a", status(q3, b3)))
add("FSDP2 2 GPUs / 1 GPU: tokens/s per GPU (1b)", ">= 97%",
    lambda: (f"{fs['tokens_per_s_per_gpu'] / b['tokens_per_s_per_gpu'] * 100:.1f}%",
             f"{fs['tokens_per_s_per_gpu']:,.0f} vs {b['tokens_per_s_per_gpu']:,.0f}; warm-up with compile cache {fs['warmup_s']:.0f} s")
    if ok(fs, b) else ("n/a", status(fs, b)))
for ac, bs in (("full", 8), ("full", 4), ("none", 8)):
    dd, ff = mem[("ddp", ac, bs)], mem[("fsdp", ac, bs)]
    add(f"peak memory/GPU FSDP2 / DDP (1b, 2 GPUs, AC {ac}, batch {bs}x2048)", "<= 0.6x",
        lambda dd=dd, ff=ff: (f"{ff['peak_mem_gib'] / dd['peak_mem_gib']:.2f}x",
                              f"{ff['peak_mem_gib']:.1f} vs {dd['peak_mem_gib']:.1f} GiB") if ok(dd, ff) else ("n/a", status(ff, dd)))
an, af = mem[("fsdp", "none", 8)], mem[("fsdp", "full", 8)]
add("activation memory AC none / full (1b FSDP2)", ">= 3x",
    lambda: (f"{an['act_mem_gib'] / af['act_mem_gib']:.1f}x", f"{an['act_mem_gib']:.2f} vs {af['act_mem_gib']:.2f} GiB")
    if ok(an, af) else ("n/a", status(an, af)))
add("8b FSDP2 + full AC, 2 GPUs", "trains", lambda: (
    f"{big['tokens_per_s_per_gpu']:,.0f} tok/s/GPU, MFU {big['mfu'] * 100:.1f}%",
    f"peak {big['peak_mem_gib']:.1f} GiB/GPU, loss {big['first_loss']:.3f} -> {big['final_loss']:.3f}")
    if ok(big) else ("n/a", status(big)))

def curve(st):
    r = next((x for x in two if x.get("preset") == "125m" and x.get("strategy") == st and x.get("fp8") == "none"
              and "optim.lr" in x.get("overrides", "")), {"status": "missing"})
    if not ok(r, ref):
        return "n/a", status(r, ref)
    diffs = [abs(x - y) for x, y in zip(r["losses"], ref["losses"])]
    tail = abs(sum(r["losses"][-10:]) - sum(ref["losses"][-10:])) / 10
    rel = tail / (sum(ref["losses"][-10:]) / 10)
    same = rel < 0.01 and max(diffs) < 0.05 * max(ref["losses"])
    return ("same within bf16 noise" if same else "DIFFERENT",
            f"max abs step diff {max(diffs):.4f}, last-10 mean diff {tail:.4f} ({rel * 100:.2f}%), "
            f"ddp {ref['losses'][0]:.3f} -> {ref['losses'][-1]:.3f}")
for st in ("hsdp", "tp"):
    add(f"loss curve {st} vs DDP (125m, 30 steps, same seed)", "same within bf16 noise", lambda st=st: curve(st))
for r in two:
    if r.get("preset") == "125m" and (r.get("fp8") != "none" or "lr=" not in r.get("overrides", "")):
        add(f"smoke 125m {r['strategy']} fp8={r['fp8']} ac={r['ac']} {r.get('overrides', '')}", "ok, finite loss",
            lambda r=r: (r["status"], f"loss {r['first_loss']:.3f} -> {r['final_loss']:.3f}, "
                                      f"{r['tokens_per_s_per_gpu']:,.0f} tok/s/GPU" if ok(r) else ""))
text = "\n".join(lines)
(d / "summary.md").write_text(text + "\n")
print(text)
EOF
note "done: $D (summary.md, single_*.json/md/png, two_gpu.json/md/png, logs)"
