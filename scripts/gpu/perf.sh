#!/usr/bin/env bash
# Issue 12 (faster and leaner than torchtitan; small-message all-reduce) on the GPU machines.
#
#   PART=levers  bash scripts/gpu/perf.sh   2xH200, ~7-9 min: each lever alone on 1b, 1 GPU
#                                           (8x2048, compile, AC none, bf16: train.loss,
#                                           parallel.sdpa_backend, and two
#                                           combinations), GPU 0 and GPU 1 concurrently; the all-reduce
#                                           latency table (NCCL vs symmetric memory, 2 GPUs);
#                                           the step-time effect of comm.small_reduce (1b FSDP2).
#   PART=titan1b bash scripts/gpu/perf.sh   2xH200, ~7 min: torchtitan vs ours, 1b bf16 and 1b
#                                           FP8 tensorwise on one GPU each (titan on GPU 0, ours on
#                                           GPU 1, concurrently), then 1b bf16 FSDP2 on 2 GPUs.
#   PART=titan8b bash scripts/gpu/perf.sh   2xH200, ~9 min: 8b FSDP2 2 GPUs AC full 4x2048, bf16
#                                           and FP8 tensorwise, both sides.
#   PART=rowwise bash scripts/gpu/perf.sh   2xH200, ~5 min: 8b FP8 rowwise, both sides.
#   PART=fp8loss bash scripts/gpu/perf.sh   2xH200, ~8 min: 8b FSDP2, 200 steps on the embedded
#                                           text, bf16 vs FP8 tensorwise (final losses).
#   PART=h100    bash scripts/gpu/perf.sh   1 GPU (H100), ~7 min: the two 1b single-GPU points,
#                                           both sides, one after the other.
#   PART=profile bash scripts/gpu/perf.sh   1 GPU, ~6 min: GPU time by kernel category (GEMM, attention,
#                                           Triton, optimizer, copies, idle) of torchtitan and ours,
#                                           1b bf16 and FP8 tensorwise (scripts/gpu/kernel_profile.py).
#   PART=optstep bash scripts/gpu/perf.sh   1 GPU, ~8 min: 1b bf16 profiled, torchtitan and ours with
#                                           optim.clip_in_step off/on; ours with Inductor's
#                                           max-autotune-no-cudagraphs.
#   PART=memory bash scripts/gpu/perf.sh    1 GPU, ~7 min: what is live at the peak of a 1b step, torchtitan
#                                           and ours (kernel_profile.py --memory); ours profiled;
#                                           parallel.activation_memory_budget 0.95/0.9; 1b FP8 both sides.
#   PART=tune1b bash scripts/gpu/perf.sh    1 GPU, ~6 min: 1b bf16 ours profiled; reshard_after_forward=always,
#                                           activation_memory_budget=0.99, chunked loss; torchtitan bf16;
#                                           FP8 tensorwise both sides.
#   PART=spend1b bash scripts/gpu/perf.sh   1 GPU, ~6 min: 1b bf16 and FP8, memory spent on speed:
#                                           activation_memory_budget=0.99 with reshard_after_forward=never;
#                                           torchtitan both precisions.
#   PART=final2 bash scripts/gpu/perf.sh    2xH200, ~9 min: the 2-GPU points, both sides: 1b FSDP2 (ours
#                                           default and activation_memory_budget=0.99), 8b bf16 and
#                                           FP8 tensorwise (ours with the chunked loss, 2048-token chunks).
#   PART=mem8b bash scripts/gpu/perf.sh     2xH200, ~4 min: what is live at the peak of an 8b step (FSDP2 on
#                                           2 GPUs, AC full), torchtitan and ours with the chunked loss.
#   PART=final8b bash scripts/gpu/perf.sh   2xH200, ~5 min: 8b bf16 and FP8 tensorwise, both sides, ours with
#                                           the chunked loss (2048-token chunks).
#   PART=h100spend bash scripts/gpu/perf.sh 1 GPU (H100), ~4 min: the 1b points with activation_memory_budget=0.99
#                                           (+ reshard_after_forward=never), both sides.
#   PART=cast1b bash scripts/gpu/perf.sh   1 GPU, ~6 min: 1b bf16 and FP8 with parallel.fsdp_one_rank=cast (the
#                                           default), bf16 also with activation_memory_budget 0.999/0.995/0.99;
#                                           torchtitan; a kernel profile of ours.
#   PART=mem1b bash scripts/gpu/perf.sh    1 GPU, ~5 min: what is live at the peak of a 1b FP8 step, both sides;
#                                           ours FP8 with the chunked loss (4096/8192) and budget 0.999.
#   PART=h100cast bash scripts/gpu/perf.sh 1 GPU (H100), ~6 min: the 1b points with fsdp_one_rank=cast, bf16 with
#                                           the chunked loss and budget 0.999; the peak of a 1b bf16 step (ours).
#   PART=final3 bash scripts/gpu/perf.sh   2xH200, ~6 min: 8b bf16 (ac_skip_last 8/9/10) and FP8 (11/12), 1b FSDP2
#                                           (default, budget 0.99, budget 0.99 + reshard never); torchtitan.
#   PART=recast bash scripts/gpu/perf.sh   2 GPUs, ~3 min: 1b, one GPU per run: torchtitan bf16/FP8 then ours with
#                                           recompute_param_casts off on GPU 0; ours with it on (bf16, FP8, each also with
#                                           the chunked loss) on GPU 1 at the same time. PART=recast2: then PART=fsdp1b.
#   PART=fsdp1b bash scripts/gpu/perf.sh   2xH200, ~2 min: 1b FSDP2, both sides; ours default, chunked loss, + fsdp_prefetch
#                                           2, + reshard_after_forward=never and budget 0.999.
#   PART=ncclfsdp bash scripts/gpu/perf.sh 2xH200, ~2 min: 1b FSDP2 (chunked, never, 0.999) under NCCL_PROTO=Simple with
#                                           NCCL_MAX_CTAS 8 / 16, and without.
#   PART=prof8b bash scripts/gpu/perf.sh   2xH200, ~3 min: kernel profiles of one 8b step (AC full): ours bf16 and FP8
#                                           tensorwise, torchtitan bf16.
#   PART=fp8ag bash scripts/gpu/perf.sh    2xH200, ~4 min: 8b FP8 (ac_skip_last 11) with fp8.fsdp_float8_all_gather
#                                           true/false, bf16 (ac_skip_last 8), torchtitan FP8; a profile of FP8 without it.
#   PART=skip8b bash scripts/gpu/perf.sh   2xH200, ~10 min: 8b bf16 and FP8, parallel.ac_skip_last 8/11/14 (one
#                                           launch each); torchtitan AC full.
#   PART=symmag bash scripts/gpu/perf.sh   2xH200, ~6 min: 1b FSDP2 (chunked, never, 0.999), parallel.fsdp_symm_mem
#                                           all_gather / all, with and without NCCL_CTA_POLICY=2; torchtitan; a profile.
#   PART=symm1b bash scripts/gpu/perf.sh   2xH200, ~4 min: 1b FSDP2, default and fsdp_symm_mem=all_gather + NCCL_CTA_POLICY=2,
#                                           twice each; torchtitan. PART=symm8b: the same at 8b FP8 (ac_skip_last 11), once;
#                                           PART=symm8bbf16: 8b bf16 (ac_skip_last 8), the key alone; a 1b profile.
#   PART=symmrs bash scripts/gpu/perf.sh  2xH200, ~4 min: 1b FSDP2, fsdp_symm_mem=all (all-to-all reduce-scatter) against
#                                           all_gather, twice each; torchtitan; a profile of all.
#                                           PART=symmrs8b: 8b bf16 (ac_skip_last 8), all against all_gather; torchtitan.
#                                           PART=symmrs8b2: the same without torchtitan.
#   PART=fsdpmem bash scripts/gpu/perf.sh  2xH200, ~5 min: 1b FSDP2 (all, never, budget 1.0): loss chunk 8192/4096, ac=pointwise
#                                           on the first 2-4 blocks; torchtitan. PART=fp8seeds: 1b bf16 / FP8 200-step losses,
#                                           three seeds each (one GPU each side, at the same time).
#   PART=fsdpauto bash scripts/gpu/perf.sh 2xH200, ~5 min: 1b FSDP2 reshard auto (+ fsdp_prefetch 1), never + pointwise on 4 blocks;
#                                           torchtitan twice. PART=fp8seeds2: PART=fp8seeds with seeds 3/4/5.
#   PART=pw4 bash scripts/gpu/perf.sh      2xH200, ~5 min: 1b FSDP2 never + pointwise on 4 blocks against torchtitan, 3x interleaved.
#   PART=bsk bash scripts/gpu/perf.sh      2xH200, ~7 min: 1b FSDP2 never + activation budget 0.999 on the first 4 blocks
#                                           (activation_memory_budget_skip_last=12) against torchtitan, 3x interleaved; 5 / 6 blocks once.
#                                           PART=bsk6: the first 6 blocks (skip_last=10), 3x interleaved; no budget once.
#                                           PART=bsk6x2: the same 2x interleaved (2xH200, ~3 min), no run without budget.
#   PART=five bash scripts/gpu/perf.sh     2 GPUs, ~9 min: the issue's five points in one call, both sides (perf_cast_skip.sh).
#                                           PART=five2: with the 1b FSDP2 budget on the first 6 blocks; SKIP_BF16 / SKIP_FP8
#                                           set the 8b ac_skip_last (default 8 / 11). PART=skip80, PART=h1008b: 8b
#                                           ac_skip_last on 80 GB cards (6-7 / 9-10; 0-4 / 0-6).
#   PART=gputests bash scripts/gpu/perf.sh  1-2 GPUs, ~1-2 min: the GPU-marked tests of
#                                           tests/train/test_loss.py and tests/comm/test_small_reduce.py.
# PART may be a comma list (run in order), e.g. PART=gputests,levers. OURS_ARGS: extra `train bench step` arguments for
# every run of ours in the titan*/rowwise/fp8loss/h100 parts, e.g.
#   OURS_ARGS="--set train.loss=chunked --set parallel.sdpa_backend=cudnn"
# torchtitan's side needs .titan/ (titan_bench.py + torchtitan-src, see
# ../shared/tools/titan_bench.md) and torchao from .whl/: carry both.
# Results: $OUT/summary.md (also printed), $OUT/results.json (every JSON of the run, by file
# name), $OUT/perf-<parts>.tgz (all JSON/MD/logs), $OUT/log.txt. Every run is time-boxed;
# a failing one is logged and the script goes on. NVLink multicast stays off (common.sh).
set -uo pipefail
# shellcheck source=scripts/gpu/common.sh
source "$(dirname "$0")/common.sh"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-8}"
FINAL_OUT="${OUT:-runs/gpu-out}"
PART="${PART:-levers}"
W="/tmp/perf-${PART//,/_}"
rm -rf "$W"
mkdir -p "$W" "$FINAL_OUT"
LOG="$W/log.txt"
: >"$LOG"
note() { echo "[perf.sh $(date +%T)] $*" | tee -a "$LOG"; }
read -r -a OURS <<<"${OURS_ARGS:-}"
# Every run's time limit is capped to what is left of BUDGET_S (seconds since the start);
# runs are skipped once it is spent, so that a 600 s device call still returns the results.
BUDGET_S="${BUDGET_S:-570}"
TT="$PWD/.titan"
TRUN=(python3 -m torch.distributed.run --standalone)
STEP=(-m train bench step --device cuda --timeout-s 300 --out "$W")
P1B=(--preset 1b --batch 8 --seq 2048 --compile on --ac none --steps 15 --warmup 4)
P8B=(--preset 8b --batch 4 --seq 2048 --compile on --ac full --steps 10 --warmup 3)
AMB99=(--set parallel.activation_memory_budget=0.99)  # memory levers of the second pass
NEVER=(--set parallel.reshard_after_forward=never)
python3 -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count(),
  torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")' 2>&1 | tee -a "$LOG"

capped() {  # LIMIT -> min(LIMIT, what is left of BUDGET_S), or nothing when under 30 s are left
  local left=$((BUDGET_S - SECONDS))
  if [ "$left" -lt 30 ]; then return 1; fi
  echo $(($1 < left ? $1 : left))
}

ours() {  # GPUS NPROC NAME LIMIT ARGS...: one `train bench step` launch
  local gpus=$1 nproc=$2 name=$3 limit
  if ! limit=$(capped "$4"); then note "$name skipped: BUDGET_S=$BUDGET_S spent"; return; fi
  shift 4
  # A fresh inductor cache per launch: the AOT-autograd/FX caches key on the traced graph,
  # not on the SDPA kernel flags, so a cached graph of another run could bring its kernel.
  # OURS_DIR: another checkout's root to run `train` from (an A/B of a change in one call)
  (cd "${OURS_DIR:-.}" && TORCHINDUCTOR_CACHE_DIR="/tmp/perf-inductor/$name" CUDA_VISIBLE_DEVICES="$gpus" \
    timeout -k 10 "$limit" "${TRUN[@]}" --nproc-per-node "$nproc" "${STEP[@]}" \
    --name "$name" "$@") >"$W/$name.log" 2>&1 || note "$name failed (exit $?); see $name.log"
  note "$name done"
}

titan() {  # GPUS NPROC NAME LIMIT ARGS...: titan_bench.py, result in titan_NAME.json
  local gpus=$1 nproc=$2 name=$3 limit
  if ! limit=$(capped "$4"); then note "titan_$name skipped: BUDGET_S=$BUDGET_S spent"; return; fi
  shift 4
  if [ ! -f "$TT/titan_bench.py" ]; then note "titan_$name skipped: no .titan/titan_bench.py (carry .titan)"; return; fi
  PYTHONPATH="$TT/torchtitan-src:${PYTHONPATH:-}" CUDA_VISIBLE_DEVICES="$gpus" timeout -k 10 "$limit" \
    "${TRUN[@]}" --nproc-per-node "$nproc" "$TT/titan_bench.py" --out "$W/titan_$name.json" "$@" \
    >"$W/titan_$name.log" 2>&1 || note "titan_$name failed (exit $?); see titan_$name.log"
  note "titan_$name done"
}

plan() {  # NAME: a plan file from stdin
  cat >"$W/$1.yaml"
  echo "$W/$1.yaml"
}

part_levers() {
  note "levers: 1b, 1 GPU each, loss modes on GPU 0, attention (kernel, GQA) on GPU 1"
  local p0 p1
  p0=$(plan levers_loss <<'EOF'
- {set: [train.loss=eager]}
- {set: [train.loss=compiled]}
- {set: [train.loss=chunked, train.loss_chunk_tokens=4096]}
- {set: [train.loss=chunked, train.loss_chunk_tokens=16384]}
- {set: [train.loss=compiled, parallel.sdpa_backend=cudnn]}
EOF
)
  p1=$(plan levers_attn <<'EOF'
- {set: [parallel.sdpa_backend=cudnn]}
- {set: [parallel.sdpa_backend=flash]}
- {set: [train.loss=chunked, parallel.sdpa_backend=cudnn]}
EOF
)
  ours 0 1 levers_loss 300 --strategy fsdp --fp8 none "${P1B[@]}" --plan "$p0" &
  ours 1 1 levers_attn 300 --strategy fsdp --fp8 none "${P1B[@]}" --plan "$p1" &
  wait
  if python3 -m train bench comm --help 2>/dev/null | grep -q -- '--impl'; then
    note "all-reduce latency 4K..4M: NCCL vs symmetric memory one-shot/two-shot (2 GPUs)"
    CUDA_VISIBLE_DEVICES=0,1 timeout -k 10 "$(capped 90 || echo 1)" "${TRUN[@]}" --nproc-per-node 2 -m train bench comm \
      --impl nccl,symm_mem --min-bytes 4K --max-bytes 4M --out "$W" --name latency >"$W/latency.log" 2>&1 \
      || note "latency failed (exit $?); see latency.log"
  else
    note "train bench comm has no --impl in this checkout: latency table skipped"
  fi
  if python3 -c 'from train.comm.config import CommConfig; assert hasattr(CommConfig, "small_reduce")' 2>/dev/null; then
    note "comm.small_reduce nccl vs symm_mem: 1b FSDP2 on 2 GPUs, and 125m (short steps)"
    local p2
    p2=$(plan small_reduce <<'EOF'
- {set: [comm.small_reduce=nccl]}
- {set: [comm.small_reduce=symm_mem]}
- {preset: 125m, batch: 2, seq: 512, compile: "off", steps: 40, warmup: 5, set: [comm.small_reduce=nccl]}
- {preset: 125m, batch: 2, seq: 512, compile: "off", steps: 40, warmup: 5, set: [comm.small_reduce=symm_mem]}
EOF
)
    ours 0,1 2 small_reduce 180 --strategy fsdp --fp8 none "${P1B[@]}" --plan "$p2"
  else
    note "no comm.small_reduce in this checkout: step-time effect skipped"
  fi
}

part_attn() {
  note "attn: 1b, 1 GPU, compiled loss; SDPA kernel auto/cudnn/flash (GPU 0) and cudnn + chunked loss (GPU 1), one launch each"
  local c=(--strategy fsdp --fp8 none "${P1B[@]}")
  (ours 0 1 attn_auto 150 "${c[@]}" --set train.loss=compiled
   ours 0 1 attn_cudnn 150 "${c[@]}" --set train.loss=compiled --set parallel.sdpa_backend=cudnn
   ours 0 1 attn_flash 150 "${c[@]}" --set train.loss=compiled --set parallel.sdpa_backend=flash) &
  (ours 1 1 attn_cudnn_chunk16k 150 "${c[@]}" --set train.loss=chunked --set train.loss_chunk_tokens=16384 \
     --set parallel.sdpa_backend=cudnn
   ours 1 1 attn_cudnn_chunk8k 150 "${c[@]}" --set train.loss=chunked --set train.loss_chunk_tokens=8192 \
     --set parallel.sdpa_backend=cudnn
   ours 1 1 attn_auto_chunk16k 150 "${c[@]}" --set train.loss=chunked --set train.loss_chunk_tokens=16384) &
  wait
}

part_fp8loss1b() {
  note "fp8loss1b: 1b, 1 GPU each, 200 steps on the embedded text: bf16 (GPU 0) and FP8 tensorwise (GPU 1)"
  local c=(--strategy fsdp --preset 1b --batch 8 --seq 2048 --compile on --ac none --steps 195 --warmup 5
    --data embedded)
  ours 0 1 fp8loss1b_bf16 280 "${c[@]}" --fp8 none "${OURS[@]}" &
  ours 1 1 fp8loss1b_fp8 280 "${c[@]}" --fp8 tensorwise "${OURS[@]}" &
  wait
}

part_gputests() {
  note "gputests: the GPU-marked tests of the loss modes and symmetric memory"
  timeout -k 10 "$(capped 240 || echo 1)" python3 -m pytest -q -m gpu -p no:cacheprovider tests/train/test_loss.py \
    tests/comm/test_small_reduce.py >"$W/gputests.log" 2>&1 || note "gputests failed (exit $?); see gputests.log"
  tail -3 "$W/gputests.log" | tee -a "$LOG"
}

KP_ARGS=(--skip 10 --active 3) KP_GPUS=0 KP_NPROC=1
profiled() {  # SIDE NAME LIMIT ARGS...: SIDE=titan|ours under scripts/gpu/kernel_profile.py "${KP_ARGS[@]}" on KP_GPUS
  local side=$1 name=$2 limit
  if ! limit=$(capped "$3"); then note "profile $name skipped: BUDGET_S=$BUDGET_S spent"; return; fi
  shift 3
  local prog=(-- "${STEP[@]}" --name "$name")
  local pp="${PYTHONPATH:-}"
  if [ "$side" = titan ]; then prog=(-- "$TT/titan_bench.py" --out "$W/titan_$name.json"); pp="$TT/torchtitan-src:$pp"; fi
  PYTHONPATH="$pp" TORCHINDUCTOR_CACHE_DIR="/tmp/perf-inductor/prof-$name" CUDA_VISIBLE_DEVICES="$KP_GPUS" \
    timeout -k 10 "$limit" "${TRUN[@]}" --nproc-per-node "$KP_NPROC" "$(dirname "$0")/kernel_profile.py" --out "$W" \
    --name "kp_$name" "${KP_ARGS[@]}" "${prog[@]}" "$@" >"$W/kp_$name.log" 2>&1 \
    || note "profile $name failed (exit $?); see kp_$name.log"
  note "profile $name done"
}

part_profile() {
  note "profile: kernel time by category, 1b on one GPU, torchtitan and ours, bf16 then FP8 tensorwise"
  profiled titan titan_1b_bf16 200 "${P1B[@]}" --fp8 none
  profiled ours ours_1b_bf16 200 --strategy fsdp --fp8 none "${P1B[@]}" "${OURS[@]}"
  profiled titan titan_1b_fp8 160 "${P1B[@]}" --fp8 tensorwise
  profiled ours ours_1b_fp8 160 --strategy fsdp --fp8 tensorwise "${P1B[@]}" "${OURS[@]}"
}

part_optstep() {
  note "optstep: 1b bf16 on one GPU, profiled: torchtitan, ours clip_in_step off/on; ours max-autotune"
  profiled titan titan_1b_bf16 150 "${P1B[@]}" --fp8 none
  profiled ours ours_1b_bf16_clipsep 150 --strategy fsdp --fp8 none "${P1B[@]}" --set optim.clip_in_step=false
  profiled ours ours_1b_bf16_clipin 150 --strategy fsdp --fp8 none "${P1B[@]}" --set optim.clip_in_step=true
  ours 0 1 1b_bf16_maxautotune 300 --strategy fsdp --fp8 none "${P1B[@]}" \
    --set parallel.compile_mode=max-autotune-no-cudagraphs --set optim.clip_in_step=true
}

part_memory() {
  note "memory: the peak of one 1b bf16 step, torchtitan and ours; ours profiled; activation memory budget; FP8"
  KP_ARGS=(--skip 8 --memory)
  profiled titan mem_titan_1b_bf16 150 "${P1B[@]}" --fp8 none
  profiled ours mem_ours_1b_bf16 150 --strategy fsdp --fp8 none "${P1B[@]}" "${OURS[@]}"
  KP_ARGS=(--skip 10 --active 3)
  profiled ours ours_1b_bf16 150 --strategy fsdp --fp8 none "${P1B[@]}" "${OURS[@]}"
  ours 0 1 1b_bf16_amb95 150 --strategy fsdp --fp8 none "${P1B[@]}" "${OURS[@]}" --set parallel.activation_memory_budget=0.95
  ours 0 1 1b_bf16_amb90 150 --strategy fsdp --fp8 none "${P1B[@]}" "${OURS[@]}" --set parallel.activation_memory_budget=0.9
  titan 0 1 1b_fp8 150 "${P1B[@]}" --fp8 tensorwise
  ours 0 1 1b_fp8 150 --strategy fsdp --fp8 tensorwise "${P1B[@]}" "${OURS[@]}"
}

part_tune1b() {
  note "tune1b: 1b on one GPU: ours profiled; memory levers; torchtitan; FP8 both sides"
  local c=(--strategy fsdp --fp8 none "${P1B[@]}" "${OURS[@]}")
  profiled ours ours_1b_bf16 150 "${c[@]}"
  titan 0 1 1b_bf16 150 "${P1B[@]}" --fp8 none
  ours 0 1 1b_bf16_rafalways 150 "${c[@]}" --set parallel.reshard_after_forward=always
  ours 0 1 1b_bf16_amb99 150 "${c[@]}" --set parallel.activation_memory_budget=0.99
  ours 0 1 1b_bf16_chunk8k 150 "${c[@]}" --set train.loss=chunked --set train.loss_chunk_tokens=8192
  titan 0 1 1b_fp8 150 "${P1B[@]}" --fp8 tensorwise
  ours 0 1 1b_fp8 150 --strategy fsdp --fp8 tensorwise "${P1B[@]}" "${OURS[@]}"
}

part_spend1b() {
  note "spend1b: 1b on one GPU, activation memory budget 0.99 and reshard_after_forward=never"
  local c=(--strategy fsdp "${P1B[@]}" "${OURS[@]}")
  titan 0 1 1b_bf16 150 "${P1B[@]}" --fp8 none
  ours 0 1 1b_bf16_amb99_never 150 "${c[@]}" --fp8 none "${AMB99[@]}" "${NEVER[@]}"
  ours 0 1 1b_bf16_never 150 "${c[@]}" --fp8 none "${NEVER[@]}"
  ours 0 1 1b_bf16_amb99 150 "${c[@]}" --fp8 none "${AMB99[@]}"
  titan 0 1 1b_fp8 150 "${P1B[@]}" --fp8 tensorwise
  ours 0 1 1b_fp8_amb99_never 150 "${c[@]}" --fp8 tensorwise "${AMB99[@]}" "${NEVER[@]}"
  ours 0 1 1b_fp8_never 150 "${c[@]}" --fp8 tensorwise "${NEVER[@]}"
  ours 0 1 1b_fp8_amb99 150 "${c[@]}" --fp8 tensorwise "${AMB99[@]}"
}

part_final2() {
  note "final2: 1b FSDP2 on 2 GPUs, then PART=final8b; torchtitan then ours"
  titan 0,1 2 1b_fsdp2 120 "${P1B[@]}" --fp8 none
  ours 0,1 2 1b_fsdp2 120 --strategy fsdp --fp8 none "${P1B[@]}" "${OURS[@]}"
  ours 0,1 2 1b_fsdp2_amb99 120 --strategy fsdp --fp8 none "${P1B[@]}" "${OURS[@]}" \
    --set parallel.activation_memory_budget=0.99
  part_final8b
}

part_mem8b() {
  note "mem8b: the peak of one 8b step on 2 GPUs, torchtitan and ours (chunked loss)"
  KP_ARGS=(--skip 4 --memory) KP_GPUS=0,1 KP_NPROC=2
  profiled titan mem_titan_8b_bf16 150 "${P8B[@]}" --steps 3 --warmup 3 --fp8 none
  profiled ours mem_ours_8b_bf16 150 --strategy fsdp --fp8 none "${P8B[@]}" --steps 3 --warmup 3 "${OURS[@]}" \
    --set train.loss=chunked --set train.loss_chunk_tokens=2048
  KP_ARGS=(--skip 10 --active 3) KP_GPUS=0 KP_NPROC=1
}

part_final8b() {
  note "final8b: 8b bf16 and FP8 tensorwise on 2 GPUs; torchtitan then ours (chunked loss)"
  local chunk=(--set train.loss=chunked --set train.loss_chunk_tokens=2048)
  titan 0,1 2 8b_bf16 150 "${P8B[@]}" --fp8 none
  ours 0,1 2 8b_bf16_chunk2k 150 --strategy fsdp --fp8 none "${P8B[@]}" "${OURS[@]}" "${chunk[@]}"
  titan 0,1 2 8b_fp8 130 "${P8B[@]}" --fp8 tensorwise
  ours 0,1 2 8b_fp8_chunk2k 130 --strategy fsdp --fp8 tensorwise "${P8B[@]}" "${OURS[@]}" "${chunk[@]}"
}

part_h100spend() {
  note "h100spend: 1b on one H100, activation memory budget 0.99 (+ reshard never); torchtitan"
  local c=(--strategy fsdp "${P1B[@]}" "${OURS[@]}")
  titan 0 1 1b_bf16 120 "${P1B[@]}" --fp8 none
  ours 0 1 1b_bf16_amb99_never 120 "${c[@]}" --fp8 none "${AMB99[@]}" "${NEVER[@]}"
  titan 0 1 1b_fp8 120 "${P1B[@]}" --fp8 tensorwise
  ours 0 1 1b_fp8_amb99 120 "${c[@]}" --fp8 tensorwise "${AMB99[@]}"
  ours 0 1 1b_fp8_amb99_never 120 "${c[@]}" --fp8 tensorwise "${AMB99[@]}" "${NEVER[@]}"
}

part_titan1b() {
  note "titan1b: 1b bf16 and FP8 tensorwise on one GPU each (titan GPU 0, ours GPU 1), then FSDP2 on 2 GPUs"
  (titan 0 1 1b_bf16 280 "${P1B[@]}" --fp8 none; titan 0 1 1b_fp8 220 "${P1B[@]}" --fp8 tensorwise) &
  (ours 1 1 1b_bf16 280 --strategy fsdp --fp8 none "${P1B[@]}" "${OURS[@]}"
   ours 1 1 1b_fp8 220 --strategy fsdp --fp8 tensorwise "${P1B[@]}" "${OURS[@]}"
   ours 1 1 1b_bf16_chunk8k 200 --strategy fsdp --fp8 none "${P1B[@]}" "${OURS[@]}" \
     --set train.loss=chunked --set train.loss_chunk_tokens=8192) &
  wait
  titan 0,1 2 1b_fsdp2 200 "${P1B[@]}" --fp8 none
  ours 0,1 2 1b_fsdp2 200 --strategy fsdp --fp8 none "${P1B[@]}" "${OURS[@]}"
}

part_titan8b() {
  note "titan8b: 8b FSDP2 2 GPUs AC full 4x2048, bf16 and FP8 tensorwise"
  titan 0,1 2 8b_bf16 150 "${P8B[@]}" --fp8 none
  ours 0,1 2 8b_bf16 150 --strategy fsdp --fp8 none "${P8B[@]}" "${OURS[@]}"
  titan 0,1 2 8b_fp8 130 "${P8B[@]}" --fp8 tensorwise
  ours 0,1 2 8b_fp8 130 --strategy fsdp --fp8 tensorwise "${P8B[@]}" "${OURS[@]}"
  local left=$((BUDGET_S - SECONDS))
  if [ "$left" -lt 100 ]; then note "8b_fp8_rowwise skipped: ${left}s left of BUDGET_S=$BUDGET_S"; return; fi
  ours 0,1 2 8b_fp8_rowwise "$((left < 150 ? left : 150))" --strategy fsdp --fp8 rowwise "${P8B[@]}" "${OURS[@]}"
}

part_rowwise() {
  note "rowwise: 8b FSDP2 2 GPUs AC full, FP8 rowwise"
  titan 0,1 2 8b_fp8_rowwise 150 "${P8B[@]}" --fp8 rowwise
  ours 0,1 2 8b_fp8_rowwise 150 --strategy fsdp --fp8 rowwise "${P8B[@]}" "${OURS[@]}"
}

part_fp8loss() {
  note "fp8loss: 8b FSDP2 2 GPUs, 200 steps on the embedded text, bf16 then FP8 tensorwise"
  ours 0,1 2 fp8loss 560 --strategy fsdp --fp8 none,tensorwise --preset 8b --batch 4 --seq 2048 --compile on \
    --ac full --steps 195 --warmup 5 --data embedded "${OURS[@]}"
}

part_h100() {
  note "h100: 1b bf16 and FP8 tensorwise on one GPU, torchtitan then ours"
  titan 0 1 1b_bf16 200 "${P1B[@]}" --fp8 none
  ours 0 1 1b_bf16 200 --strategy fsdp --fp8 none "${P1B[@]}" "${OURS[@]}"
  titan 0 1 1b_fp8 150 "${P1B[@]}" --fp8 tensorwise
  ours 0 1 1b_fp8 150 --strategy fsdp --fp8 tensorwise "${P1B[@]}" "${OURS[@]}"
}

# shellcheck source=scripts/gpu/perf_cast_skip.sh
source "$(dirname "$0")/perf_cast_skip.sh"

IFS=, read -r -a PARTS <<<"$PART"
for p in "${PARTS[@]}"; do
  if ! declare -F "part_$p" >/dev/null; then
    note "unknown PART=$p ($(declare -F | sed -n 's/^declare -f part_//p' | paste -sd, -))"
    exit 2
  fi
  "part_$p"
done

python3 "$(dirname "$0")/perf_summary.py" "$W" >"$W/summary.md" 2>>"$LOG" || note "summary failed"
python3 - "$W" >"$FINAL_OUT/results.json" <<'EOF' || note "results.json failed"
import json, sys
from pathlib import Path
out = {}
for p in sorted(Path(sys.argv[1]).glob("*.json")):
    try:
        out[p.name] = json.loads(p.read_text())
    except ValueError as exc:
        out[p.name] = {"unreadable": str(exc)}
print(json.dumps(out, indent=1))
EOF
cp "$W/summary.md" "$LOG" "$FINAL_OUT/" 2>/dev/null || true
tar -czf "$FINAL_OUT/perf-${PART//,/_}.tgz" -C "$W" . || note "tar failed"
cat "$W/summary.md"
