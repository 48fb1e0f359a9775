# shellcheck shell=bash
# The parts of scripts/gpu/perf.sh of the third and fourth passes of issue 12 (fsdp_one_rank=cast,
# ac_skip_last, recompute_param_casts, FSDP2 and FP8 levers); sourced by perf.sh, which defines the helpers
# (ours, titan, profiled, plan, note) and the shapes (P1B, P8B, OURS, AMB99, KP_ARGS).
# shellcheck disable=SC2034  # KP_ARGS is read by perf.sh's profiled()
part_cast1b() {
  note "cast1b: 1b on one GPU, parallel.fsdp_one_rank=cast (default), activation memory budgets; torchtitan"
  local c=(--strategy fsdp "${P1B[@]}" "${OURS[@]}") p
  p=$(plan amb <<'EOF'
- {set: [parallel.activation_memory_budget=0.999]}
- {set: [parallel.activation_memory_budget=0.995]}
- {set: [parallel.activation_memory_budget=0.99]}
EOF
)
  titan 0 1 1b_bf16 140 "${P1B[@]}" --fp8 none
  ours 0 1 1b_bf16_cast 120 "${c[@]}" --fp8 none
  ours 0 1 1b_bf16_cast_amb 180 "${c[@]}" --fp8 none --plan "$p"
  titan 0 1 1b_fp8 140 "${P1B[@]}" --fp8 tensorwise
  ours 0 1 1b_fp8_cast 120 "${c[@]}" --fp8 tensorwise
  profiled ours kp_ours_1b_bf16_cast 120 "${c[@]}" --fp8 none
}

part_mem1b() {
  note "mem1b: the peak of one 1b FP8 step, torchtitan and ours (cast); ours FP8 with the chunked loss, budget 0.999"
  local c=(--strategy fsdp "${P1B[@]}" "${OURS[@]}") p
  p=$(plan fp8mem <<'EOF'
- {set: [train.loss=chunked, train.loss_chunk_tokens=4096]}
- {set: [train.loss=chunked, train.loss_chunk_tokens=8192]}
- {set: [parallel.activation_memory_budget=0.999]}
EOF
)
  KP_ARGS=(--skip 6 --memory)
  profiled titan mem_titan_1b_fp8 120 "${P1B[@]}" --fp8 tensorwise
  profiled ours mem_ours_1b_fp8 120 "${c[@]}" --fp8 tensorwise
  KP_ARGS=(--skip 10 --active 3)
  ours 0 1 1b_fp8_mem 200 "${c[@]}" --fp8 tensorwise --plan "$p"
}

part_h100cast() {
  note "h100cast: the 1b points on one GPU with parallel.fsdp_one_rank=cast; bf16 loss/budget variants; the bf16 peak"
  local c=(--strategy fsdp "${P1B[@]}" "${OURS[@]}") p
  local chunk=(--set train.loss=chunked --set train.loss_chunk_tokens=8192)
  p=$(plan bf16mem <<'EOF'
- {set: [train.loss=chunked, train.loss_chunk_tokens=8192]}
- {set: [parallel.activation_memory_budget=0.999]}
- {set: [train.loss=chunked, train.loss_chunk_tokens=8192, parallel.activation_memory_budget=0.999]}
EOF
)
  titan 0 1 1b_bf16 140 "${P1B[@]}" --fp8 none
  ours 0 1 1b_bf16_cast 120 "${c[@]}" --fp8 none
  ours 0 1 1b_bf16_cast_mem 200 "${c[@]}" --fp8 none --plan "$p"
  titan 0 1 1b_fp8 140 "${P1B[@]}" --fp8 tensorwise
  ours 0 1 1b_fp8_cast_chunk8k 120 "${c[@]}" --fp8 tensorwise "${chunk[@]}"
  KP_ARGS=(--skip 6 --memory)
  profiled ours mem_ours_1b_bf16_cast 120 "${c[@]}" --fp8 none
  KP_ARGS=(--skip 10 --active 3)
}

part_skip8b() {
  note "skip8b: 8b on 2 GPUs, AC full but the last k blocks (parallel.ac_skip_last), chunked loss; torchtitan AC full"
  local chunk=(--set train.loss=chunked --set train.loss_chunk_tokens=2048) p
  p=$(plan skip8b <<'EOF'
- {set: [parallel.ac_skip_last=8]}
- {set: [parallel.ac_skip_last=11]}
- {set: [parallel.ac_skip_last=14]}
EOF
)
  titan 0,1 2 8b_bf16 140 "${P8B[@]}" --fp8 none
  ours 0,1 2 8b_bf16_skip 200 --strategy fsdp --fp8 none "${P8B[@]}" "${OURS[@]}" "${chunk[@]}" --plan "$p"
  titan 0,1 2 8b_fp8 120 "${P8B[@]}" --fp8 tensorwise
  ours 0,1 2 8b_fp8_skip 200 --strategy fsdp --fp8 tensorwise "${P8B[@]}" "${OURS[@]}" "${chunk[@]}" --plan "$p"
}

part_final3() {
  note "final3: 8b bf16 and FP8 on 2 GPUs with parallel.ac_skip_last near the memory limit, 1b FSDP2; torchtitan"
  local chunk=(--set train.loss=chunked --set train.loss_chunk_tokens=2048) pb pf p1
  pb=$(plan skip_bf16 <<'EOF'
- {set: [parallel.ac_skip_last=8]}
- {set: [parallel.ac_skip_last=9]}
- {set: [parallel.ac_skip_last=10]}
EOF
)
  pf=$(plan skip_fp8 <<'EOF'
- {set: [parallel.ac_skip_last=11]}
- {set: [parallel.ac_skip_last=12]}
EOF
)
  p1=$(plan fsdp2 <<'EOF'
- {set: []}
- {set: [parallel.activation_memory_budget=0.99]}
- {set: [parallel.activation_memory_budget=0.99, parallel.reshard_after_forward=never]}
EOF
)
  titan 0,1 2 8b_bf16 140 "${P8B[@]}" --fp8 none
  ours 0,1 2 8b_bf16_skip 200 --strategy fsdp --fp8 none "${P8B[@]}" "${OURS[@]}" "${chunk[@]}" --plan "$pb"
  titan 0,1 2 8b_fp8 120 "${P8B[@]}" --fp8 tensorwise
  ours 0,1 2 8b_fp8_skip 170 --strategy fsdp --fp8 tensorwise "${P8B[@]}" "${OURS[@]}" "${chunk[@]}" --plan "$pf"
  titan 0,1 2 1b_fsdp2 100 "${P1B[@]}" --fp8 none
  ours 0,1 2 1b_fsdp2 150 --strategy fsdp --fp8 none "${P1B[@]}" "${OURS[@]}" --plan "$p1"
}

part_recast() {
  note "recast: parallel.recompute_param_casts on 1b, one GPU each: torchtitan then ours (off) on GPU 0, ours (on) on GPU 1"
  local c=(--strategy fsdp "${P1B[@]}" "${OURS[@]}")
  local chunk=(--set train.loss=chunked --set train.loss_chunk_tokens=8192)
  # one launch each: a fresh Inductor cache per launch, so that no variant reuses another's graphs
  (titan 0 1 1b_bf16 150 "${P1B[@]}" --fp8 none
   titan 0 1 1b_fp8 150 "${P1B[@]}" --fp8 tensorwise
   ours 0 1 1b_bf16_norecast 110 "${c[@]}" --fp8 none --set parallel.recompute_param_casts=false) &
  (ours 1 1 1b_bf16_recast 110 "${c[@]}" --fp8 none --set parallel.recompute_param_casts=true
   ours 1 1 1b_bf16_recast_chunk8k 110 "${c[@]}" --fp8 none "${chunk[@]}" --set parallel.recompute_param_casts=true
   ours 1 1 1b_fp8_recast_chunk8k 110 "${c[@]}" --fp8 tensorwise "${chunk[@]}" \
     --set parallel.recompute_param_casts=true
   ours 1 1 1b_fp8_recast 110 "${c[@]}" --fp8 tensorwise --set parallel.recompute_param_casts=true) &
  wait
}

part_fsdp1b() {
  note "fsdp1b: 1b FSDP2 on 2 GPUs, both sides; ours default, chunked loss 8192, + fsdp_prefetch 2, + reshard never and budget 0.999"
  local p
  p=$(plan fsdp1b <<'EOF'
- {set: []}
- {set: [train.loss=chunked, train.loss_chunk_tokens=8192]}
- {set: [train.loss=chunked, train.loss_chunk_tokens=8192, parallel.fsdp_prefetch=2]}
- {set: [train.loss=chunked, train.loss_chunk_tokens=8192, parallel.reshard_after_forward=never, parallel.activation_memory_budget=0.999]}
EOF
)
  titan 0,1 2 1b_fsdp2 110 "${P1B[@]}" --fp8 none
  ours 0,1 2 1b_fsdp2 240 --strategy fsdp --fp8 none "${P1B[@]}" "${OURS[@]}" --plan "$p"
}

part_recast2() {
  note "recast2: PART=recast, then PART=fsdp1b"
  part_recast
  part_fsdp1b
}

part_prof8b() {
  note "prof8b: GPU time by kernel category of one 8b step on 2 GPUs (FSDP2, AC full, 4x2048), bf16 and FP8 tensorwise: ours, torchtitan bf16"
  local chunk=(--set train.loss=chunked --set train.loss_chunk_tokens=2048)
  KP_ARGS=(--skip 5 --active 3) KP_GPUS=0,1 KP_NPROC=2
  profiled ours ours_8b_bf16 170 --strategy fsdp --fp8 none "${P8B[@]}" "${OURS[@]}" "${chunk[@]}"
  profiled ours ours_8b_fp8 170 --strategy fsdp --fp8 tensorwise "${P8B[@]}" "${OURS[@]}" "${chunk[@]}"
  profiled titan titan_8b_bf16 170 "${P8B[@]}" --fp8 none
  KP_ARGS=(--skip 10 --active 3) KP_GPUS=0 KP_NPROC=1
}

part_ncclfsdp() {
  note "ncclfsdp: 1b FSDP2 on 2 GPUs (chunked loss, reshard never, budget 0.999) under NCCL_PROTO=Simple with NCCL_MAX_CTAS 8 / 16"
  local c=(--strategy fsdp --fp8 none "${P1B[@]}" "${OURS[@]}" --set train.loss=chunked --set train.loss_chunk_tokens=8192
    --set parallel.reshard_after_forward=never --set parallel.activation_memory_budget=0.999)
  ours 0,1 2 1b_fsdp2_nccl_default 110 "${c[@]}"
  NCCL_PROTO=Simple NCCL_MAX_CTAS=8 ours 0,1 2 1b_fsdp2_simple_cta8 110 "${c[@]}"
  NCCL_PROTO=Simple NCCL_MAX_CTAS=16 ours 0,1 2 1b_fsdp2_simple_cta16 110 "${c[@]}"
}

part_fp8ag() {
  note "fp8ag: 8b FP8 tensorwise on 2 GPUs (chunked loss 2048, ac_skip_last 11), fp8.fsdp_float8_all_gather true / false; bf16 ac_skip_last 8; torchtitan FP8"
  local c=(--strategy fsdp "${P8B[@]}" "${OURS[@]}" --set train.loss=chunked --set train.loss_chunk_tokens=2048)
  titan 0,1 2 8b_fp8 120 "${P8B[@]}" --fp8 tensorwise
  ours 0,1 2 8b_fp8_ag_fp8 110 "${c[@]}" --fp8 tensorwise --set parallel.ac_skip_last=11 --set fp8.fsdp_float8_all_gather=true
  ours 0,1 2 8b_fp8_ag_bf16 110 "${c[@]}" --fp8 tensorwise --set parallel.ac_skip_last=11 --set fp8.fsdp_float8_all_gather=false
  ours 0,1 2 8b_bf16_skip8 110 "${c[@]}" --fp8 none --set parallel.ac_skip_last=8
  KP_ARGS=(--skip 5 --active 3) KP_GPUS=0,1 KP_NPROC=2
  profiled ours ours_8b_fp8_ag_bf16 130 "${c[@]}" --fp8 tensorwise --set fp8.fsdp_float8_all_gather=false
  KP_ARGS=(--skip 10 --active 3) KP_GPUS=0 KP_NPROC=1
}

symm_1b_base() {  # the 1b FSDP2 settings of the symm* parts in C1B (FSDP2's default collectives); torchtitan and ours
  C1B=(--strategy fsdp --fp8 none "${P1B[@]}" "${OURS[@]}" --set train.loss=chunked --set train.loss_chunk_tokens=8192
    --set parallel.reshard_after_forward=never --set parallel.activation_memory_budget=0.999 --set parallel.fsdp_symm_mem=none)
  titan 0,1 2 1b_fsdp2 100 "${P1B[@]}" --fp8 none
  ours 0,1 2 1b_fsdp2 100 "${C1B[@]}"
}

part_symmag() {
  note "symmag: 1b FSDP2 on 2 GPUs (chunked loss, reshard never, budget 0.999): parallel.fsdp_symm_mem all_gather / all, with and without NCCL_CTA_POLICY=2 (copy-engine all-gather); torchtitan; a profile"
  symm_1b_base
  local c=("${C1B[@]}")
  NCCL_CTA_POLICY=2 ours 0,1 2 1b_fsdp2_ag_ce 100 "${c[@]}" --set parallel.fsdp_symm_mem=all_gather
  ours 0,1 2 1b_fsdp2_ag_kernel 100 "${c[@]}" --set parallel.fsdp_symm_mem=all_gather
  NCCL_CTA_POLICY=2 ours 0,1 2 1b_fsdp2_all_ce 100 "${c[@]}" --set parallel.fsdp_symm_mem=all
  ours 0,1 2 1b_fsdp2_again 100 "${c[@]}"
  NCCL_CTA_POLICY=2 ours 0,1 2 1b_fsdp2_ag_ce_again 100 "${c[@]}" --set parallel.fsdp_symm_mem=all_gather
  KP_GPUS=0,1 KP_NPROC=2 NCCL_CTA_POLICY=2 profiled ours fsdp2_ag_ce 120 "${c[@]}" --set parallel.fsdp_symm_mem=all_gather
}

part_symm1b() {
  note "symm1b: 1b FSDP2 on 2 GPUs (chunked loss, reshard never, budget 0.999), default against fsdp_symm_mem=all_gather with NCCL_CTA_POLICY=2, twice each, interleaved; torchtitan"
  symm_1b_base
  local c=("${C1B[@]}")
  NCCL_CTA_POLICY=2 ours 0,1 2 1b_fsdp2_ce 100 "${c[@]}" --set parallel.fsdp_symm_mem=all_gather
  ours 0,1 2 1b_fsdp2_again 100 "${c[@]}"
  NCCL_CTA_POLICY=2 ours 0,1 2 1b_fsdp2_ce_again 100 "${c[@]}" --set parallel.fsdp_symm_mem=all_gather
}

part_symm8b() {
  note "symm8b: 8b FP8 tensorwise on 2 GPUs (chunked loss 2048, ac_skip_last 11, bf16 all-gather), default against fsdp_symm_mem=all_gather with NCCL_CTA_POLICY=2; torchtitan"
  local c=(--strategy fsdp "${P8B[@]}" "${OURS[@]}" --set train.loss=chunked --set train.loss_chunk_tokens=2048
    --fp8 tensorwise --set parallel.ac_skip_last=11 --set fp8.fsdp_float8_all_gather=false --set parallel.fsdp_symm_mem=none)
  titan 0,1 2 8b_fp8 120 "${P8B[@]}" --fp8 tensorwise
  ours 0,1 2 8b_fp8 110 "${c[@]}"
  NCCL_CTA_POLICY=2 ours 0,1 2 8b_fp8_ce 110 "${c[@]}" --set parallel.fsdp_symm_mem=all_gather
}

part_symm8bbf16() {
  note "symm8bbf16: 8b bf16 on 2 GPUs (chunked loss 2048, ac_skip_last 8), default against fsdp_symm_mem=all_gather (NCCL_CTA_POLICY=2 set by the trainer); torchtitan; a 1b FSDP2 profile with the key alone"
  local c=(--strategy fsdp "${P8B[@]}" "${OURS[@]}" --set train.loss=chunked --set train.loss_chunk_tokens=2048
    --fp8 none --set parallel.ac_skip_last=8 --set parallel.fsdp_symm_mem=none)
  local c1=(--strategy fsdp --fp8 none "${P1B[@]}" "${OURS[@]}" --set train.loss=chunked --set train.loss_chunk_tokens=8192
    --set parallel.reshard_after_forward=never --set parallel.activation_memory_budget=0.999 --set parallel.fsdp_symm_mem=all_gather)
  KP_GPUS=0,1 KP_NPROC=2 profiled ours fsdp2_symm_key 100 "${c1[@]}"
  titan 0,1 2 8b_bf16 140 "${P8B[@]}" --fp8 none
  ours 0,1 2 8b_bf16 110 "${c[@]}"
  ours 0,1 2 8b_bf16_ce 110 "${c[@]}" --set parallel.fsdp_symm_mem=all_gather
}

part_symmrs() {
  note "symmrs: 1b FSDP2 on 2 GPUs (chunked loss, reshard never, budget 0.999): fsdp_symm_mem=all (the reduce-scatter as a copy-engine all-to-all + a local sum) against all_gather (the default), twice each, interleaved; torchtitan; a profile of all; libtorch's NCCL all-to-all symbols"
  { nm -D "$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')/lib/libtorch_cuda.so" | grep -i 'nccl.*to.*all' || true; } >"$W/nccl_alltoall_symbols.txt" 2>&1
  local c=(--strategy fsdp --fp8 none "${P1B[@]}" "${OURS[@]}" --set train.loss=chunked --set train.loss_chunk_tokens=8192
    --set parallel.reshard_after_forward=never --set parallel.activation_memory_budget=0.999)
  titan 0,1 2 1b_fsdp2 100 "${P1B[@]}" --fp8 none
  ours 0,1 2 1b_fsdp2_ag 100 "${c[@]}" --set parallel.fsdp_symm_mem=all_gather
  ours 0,1 2 1b_fsdp2_all 100 "${c[@]}" --set parallel.fsdp_symm_mem=all
  ours 0,1 2 1b_fsdp2_ag_again 100 "${c[@]}" --set parallel.fsdp_symm_mem=all_gather
  ours 0,1 2 1b_fsdp2_all_again 100 "${c[@]}" --set parallel.fsdp_symm_mem=all
  KP_GPUS=0,1 KP_NPROC=2 profiled ours fsdp2_all 100 "${c[@]}" --set parallel.fsdp_symm_mem=all
}

symmrs8b_ours() {  # LIMIT: 8b bf16 on 2 GPUs (chunked loss 2048, ac_skip_last 8), fsdp_symm_mem all_gather then all
  local b=(--strategy fsdp "${P8B[@]}" "${OURS[@]}" --set train.loss=chunked --set train.loss_chunk_tokens=2048 --fp8 none
    --set parallel.ac_skip_last=8)
  ours 0,1 2 8b_bf16_ag "$1" "${b[@]}" --set parallel.fsdp_symm_mem=all_gather
  ours 0,1 2 8b_bf16_all "$1" "${b[@]}" --set parallel.fsdp_symm_mem=all
}

part_symmrs8b() {
  note "symmrs8b: 8b bf16 on 2 GPUs (chunked loss 2048, ac_skip_last 8): fsdp_symm_mem=all against all_gather; torchtitan"
  titan 0,1 2 8b_bf16 120 "${P8B[@]}" --fp8 none
  symmrs8b_ours 100
}

part_symmrs8b2() {
  note "symmrs8b2: PART=symmrs8b's two runs of ours without torchtitan (8b bf16, ac_skip_last 8: all_gather, all)"
  symmrs8b_ours 90
}

part_ab() {
  note "ab: 1b FSDP2 on 2 GPUs (chunked loss 8192, reshard never, budget 0.999, fsdp_symm_mem=all), this tree (A) against the tree at OURS_B (B: another checkout's root holding its train/ and launch/, default .abold), twice each, interleaved; torchtitan"
  local c=(--strategy fsdp --fp8 none "${P1B[@]}" "${OURS[@]}" --set train.loss=chunked --set train.loss_chunk_tokens=8192
    --set parallel.reshard_after_forward=never --set parallel.activation_memory_budget=0.999 --set parallel.fsdp_symm_mem=all)
  local other=${OURS_B:-.abold}  # e.g. mkdir .abold && git archive HEAD train launch | tar -x -C .abold (untracked: it travels)
  titan 0,1 2 1b_fsdp2 100 "${P1B[@]}" --fp8 none
  ours 0,1 2 1b_all_a 100 "${c[@]}"
  OURS_DIR=$other ours 0,1 2 1b_all_b 100 "${c[@]}"
  ours 0,1 2 1b_all_a_again 100 "${c[@]}"
  OURS_DIR=$other ours 0,1 2 1b_all_b_again 100 "${c[@]}"
}

part_reshard() {
  note "reshard: 1b FSDP2 on 2 GPUs (chunked loss 8192, fsdp_symm_mem=all: both collectives on the copy engines): reshard_after_forward never/auto x activation_memory_budget 0.999/0.9995/1.0; torchtitan"
  local c=(--strategy fsdp --fp8 none "${P1B[@]}" "${OURS[@]}" --set train.loss=chunked --set train.loss_chunk_tokens=8192
    --set parallel.fsdp_symm_mem=all)
  titan 0,1 2 1b_fsdp2 100 "${P1B[@]}" --fp8 none
  ours 0,1 2 1b_never_0999 100 "${c[@]}" --set parallel.reshard_after_forward=never --set parallel.activation_memory_budget=0.999
  ours 0,1 2 1b_auto_1 100 "${c[@]}" --set parallel.reshard_after_forward=auto --set parallel.activation_memory_budget=1.0
  ours 0,1 2 1b_auto_09995 100 "${c[@]}" --set parallel.reshard_after_forward=auto --set parallel.activation_memory_budget=0.9995
  ours 0,1 2 1b_never_09995 100 "${c[@]}" --set parallel.reshard_after_forward=never --set parallel.activation_memory_budget=0.9995
  ours 0,1 2 1b_never_1 100 "${c[@]}" --set parallel.reshard_after_forward=never --set parallel.activation_memory_budget=1.0
  ours 0,1 2 1b_auto_1_again 100 "${c[@]}" --set parallel.reshard_after_forward=auto --set parallel.activation_memory_budget=1.0
}

part_chunk() {
  note "chunk: 1b FSDP2 on 2 GPUs (fsdp_symm_mem=all, reshard_after_forward=never, no activation budget): the chunked loss's chunk 8192 / 4096 / 2048 tokens; never + budget 0.999 (chunk 8192); torchtitan"
  local c=(--strategy fsdp --fp8 none "${P1B[@]}" "${OURS[@]}" --set train.loss=chunked --set parallel.fsdp_symm_mem=all
    --set parallel.reshard_after_forward=never)
  titan 0,1 2 1b_fsdp2 100 "${P1B[@]}" --fp8 none
  ours 0,1 2 1b_c4096 100 "${c[@]}" --set train.loss_chunk_tokens=4096
  ours 0,1 2 1b_c2048 100 "${c[@]}" --set train.loss_chunk_tokens=2048
  ours 0,1 2 1b_c8192 100 "${c[@]}" --set train.loss_chunk_tokens=8192
  ours 0,1 2 1b_c8192_0999 100 "${c[@]}" --set train.loss_chunk_tokens=8192 --set parallel.activation_memory_budget=0.999
  ours 0,1 2 1b_c4096_again 100 "${c[@]}" --set train.loss_chunk_tokens=4096
}

part_symm8bdef() {
  note "symm8bdef: 8b bf16 (chunked 2048, ac_skip_last 8) and FP8 tensorwise (ac_skip_last 11, bf16 all-gather) on 2 GPUs with the default fsdp_symm_mem (auto: copy-engine all-gather); torchtitan"
  local c=(--strategy fsdp "${P8B[@]}" "${OURS[@]}" --set train.loss=chunked --set train.loss_chunk_tokens=2048)
  titan 0,1 2 8b_bf16 120 "${P8B[@]}" --fp8 none
  ours 0,1 2 8b_bf16_auto 110 "${c[@]}" --fp8 none --set parallel.ac_skip_last=8
  titan 0,1 2 8b_fp8 110 "${P8B[@]}" --fp8 tensorwise
  ours 0,1 2 8b_fp8_auto 110 "${c[@]}" --fp8 tensorwise --set parallel.ac_skip_last=11 --set fp8.fsdp_float8_all_gather=false
}

five_runs() {  # SKIP_BF16 SKIP_FP8 FSDP2_ARGS...: the issue's five points, both sides, in one call; ours with
  # 1b one GPU: recompute_param_casts + chunked 8192; 1b FSDP2: FSDP2_ARGS; 8b: chunked 2048, ac_skip_last
  # SKIP_BF16 (bf16) / SKIP_FP8 (FP8 tensorwise, bf16 all-gather), default fsdp_symm_mem
  local sb=$1 sf=$2
  shift 2
  local one=(--strategy fsdp "${P1B[@]}" "${OURS[@]}" --set parallel.recompute_param_casts=true
    --set train.loss=chunked --set train.loss_chunk_tokens=8192)
  C8=(--strategy fsdp "${P8B[@]}" "${OURS[@]}" --set train.loss=chunked --set train.loss_chunk_tokens=2048)
  # one GPU each side at the same time, as in PART=recast
  (titan 0 1 1b_bf16 150 "${P1B[@]}" --fp8 none; titan 0 1 1b_fp8 150 "${P1B[@]}" --fp8 tensorwise) &
  (ours 1 1 1b_bf16 120 "${one[@]}" --fp8 none; ours 1 1 1b_fp8 120 "${one[@]}" --fp8 tensorwise) &
  wait
  titan 0,1 2 1b_fsdp2 100 "${P1B[@]}" --fp8 none
  ours 0,1 2 1b_fsdp2 100 --strategy fsdp --fp8 none "${P1B[@]}" "${OURS[@]}" "$@"
  titan 0,1 2 8b_bf16 120 "${P8B[@]}" --fp8 none
  ours 0,1 2 8b_bf16 110 "${C8[@]}" --fp8 none --set parallel.ac_skip_last="$sb"
  titan 0,1 2 8b_fp8 110 "${P8B[@]}" --fp8 tensorwise
  ours 0,1 2 8b_fp8 110 "${C8[@]}" --fp8 tensorwise --set parallel.ac_skip_last="$sf" --set fp8.fsdp_float8_all_gather=false
}

part_five() {
  note "five: the issue's five points in one call, ours with each point's best settings so far (1b one GPU: recompute_param_casts + chunked 8192; 1b FSDP2: chunked 8192, never, budget 0.999, fsdp_symm_mem=all; 8b: chunked 2048, ac_skip_last 8 (bf16) / 11 (FP8, bf16 all-gather), default fsdp_symm_mem); then 8b FP8 with the float8 all-gather; torchtitan"
  five_runs 8 11 --set train.loss=chunked --set train.loss_chunk_tokens=8192 --set parallel.reshard_after_forward=never \
    --set parallel.activation_memory_budget=0.999 --set parallel.fsdp_symm_mem=all
  ours 0,1 2 8b_fp8_f8ag 110 "${C8[@]}" --fp8 tensorwise --set parallel.ac_skip_last=11 --set fp8.fsdp_float8_all_gather=true
}

part_five2() {
  note "five2: PART=five with the 1b FSDP2 setting of the seventh pass (budget 0.999 on the first 6 blocks) and ac_skip_last SKIP_BF16=${SKIP_BF16:-8} / SKIP_FP8=${SKIP_FP8:-11} at 8b; no float8 all-gather run"
  five_runs "${SKIP_BF16:-8}" "${SKIP_FP8:-11}" --set train.loss=chunked --set train.loss_chunk_tokens=8192 \
    --set parallel.reshard_after_forward=never --set parallel.fsdp_symm_mem=all \
    --set parallel.activation_memory_budget=0.999 --set parallel.activation_memory_budget_skip_last=10
}

part_h1008b() {
  note "h1008b: 8b on 80 GB cards (H100), chunked loss 2048: AC on every block or all but the last 2 / 4 (bf16), 3 / 6 (FP8 tensorwise, bf16 all-gather); reserved_gib and alloc_retries in the rows; torchtitan"
  local c8=(--strategy fsdp "${P8B[@]}" "${OURS[@]}" --set train.loss=chunked --set train.loss_chunk_tokens=2048) k
  titan 0,1 2 8b_bf16 120 "${P8B[@]}" --fp8 none
  for k in 0 2 4; do
    ours 0,1 2 "8b_bf16_skip$k" 100 "${c8[@]}" --fp8 none --set parallel.ac_skip_last="$k"
  done
  titan 0,1 2 8b_fp8 110 "${P8B[@]}" --fp8 tensorwise
  for k in 0 3 6; do
    ours 0,1 2 "8b_fp8_skip$k" 100 "${c8[@]}" --fp8 tensorwise --set parallel.ac_skip_last="$k" \
      --set fp8.fsdp_float8_all_gather=false
  done
}

part_skip80() {
  note "skip80: 8b on 80 GB cards (H100): ac_skip_last below the H200-sized 8 (bf16) / 11 (FP8), for allocator headroom (reserved_gib, alloc_retries in the rows); torchtitan"
  local c8=(--strategy fsdp "${P8B[@]}" "${OURS[@]}" --set train.loss=chunked --set train.loss_chunk_tokens=2048)
  titan 0,1 2 8b_bf16 120 "${P8B[@]}" --fp8 none
  ours 0,1 2 8b_bf16_skip6 100 "${c8[@]}" --fp8 none --set parallel.ac_skip_last=6
  ours 0,1 2 8b_bf16_skip7 100 "${c8[@]}" --fp8 none --set parallel.ac_skip_last=7
  titan 0,1 2 8b_fp8 110 "${P8B[@]}" --fp8 tensorwise
  ours 0,1 2 8b_fp8_skip9 100 "${c8[@]}" --fp8 tensorwise --set parallel.ac_skip_last=9 --set fp8.fsdp_float8_all_gather=false
  ours 0,1 2 8b_fp8_skip10 100 "${c8[@]}" --fp8 tensorwise --set parallel.ac_skip_last=10 --set fp8.fsdp_float8_all_gather=false
}

part_fsdpmem() {
  note "fsdpmem: 1b FSDP2 on 2 GPUs (fsdp_symm_mem=all, reshard never, no activation budget; the embedding is freed after forward and not gathered for backward): chunk 8192 / 4096; parallel.ac=pointwise on the first 2 / 3 / 4 blocks (ac_skip_last 14 / 13 / 12); torchtitan"
  local c=(--strategy fsdp --fp8 none "${P1B[@]}" "${OURS[@]}" --set train.loss=chunked --set parallel.fsdp_symm_mem=all
    --set parallel.reshard_after_forward=never)
  local pw=(--ac pointwise)
  titan 0,1 2 1b_fsdp2 100 "${P1B[@]}" --fp8 none
  ours 0,1 2 1b_c8192 90 "${c[@]}" --set train.loss_chunk_tokens=8192
  ours 0,1 2 1b_c8192_pw3 90 "${c[@]}" --set train.loss_chunk_tokens=8192 "${pw[@]}" --set parallel.ac_skip_last=13
  ours 0,1 2 1b_c4096 90 "${c[@]}" --set train.loss_chunk_tokens=4096
  ours 0,1 2 1b_c4096_pw2 90 "${c[@]}" --set train.loss_chunk_tokens=4096 "${pw[@]}" --set parallel.ac_skip_last=14
  ours 0,1 2 1b_c8192_pw4 90 "${c[@]}" --set train.loss_chunk_tokens=8192 "${pw[@]}" --set parallel.ac_skip_last=12
  ours 0,1 2 1b_c8192_again 90 "${c[@]}" --set train.loss_chunk_tokens=8192
}

fp8seeds_runs() {  # NAME SEED...: 1b, one GPU each, 200 steps on the embedded text per seed (init and data
  # order): bf16 on GPU 0, FP8 tensorwise on GPU 1 at the same time; one launch per side, the seeds as plan points
  local name=$1 seed p
  shift
  local c=(--strategy fsdp --preset 1b --batch 8 --seq 2048 --compile on --ac none --steps 195 --warmup 5
    --data embedded "${OURS[@]}")
  p=$(for seed in "$@"; do echo "- {set: [train.seed=$seed]}"; done | plan "$name")
  ours 0 1 "${name}_bf16" 260 "${c[@]}" --fp8 none --plan "$p" &
  ours 1 1 "${name}_fp8" 260 "${c[@]}" --fp8 tensorwise --plan "$p" &
  wait
}

part_fp8seeds() {
  note "fp8seeds: 1b, one GPU each, 200 steps on the embedded text, seeds 1234 / 1 / 2: bf16 on GPU 0, FP8 tensorwise on GPU 1"
  fp8seeds_runs fp8seeds 1234 1 2
}

part_fp8seeds2() {
  note "fp8seeds2: PART=fp8seeds with seeds 3 / 4 / 5"
  fp8seeds_runs fp8seeds2 3 4 5
}

part_fsdpauto() {
  note "fsdpauto: 1b FSDP2 on 2 GPUs (fsdp_symm_mem=all, chunk 8192, no activation budget), now that the embedding is not gathered for backward: reshard_after_forward=auto, + fsdp_prefetch=1; never + ac=pointwise on the first 4 blocks; torchtitan twice"
  local c=(--strategy fsdp --fp8 none "${P1B[@]}" "${OURS[@]}" --set train.loss=chunked --set parallel.fsdp_symm_mem=all
    --set train.loss_chunk_tokens=8192)
  titan 0,1 2 1b_fsdp2 100 "${P1B[@]}" --fp8 none
  ours 0,1 2 1b_auto 90 "${c[@]}" --set parallel.reshard_after_forward=auto
  ours 0,1 2 1b_never_pw4 90 "${c[@]}" --set parallel.reshard_after_forward=never --ac pointwise \
    --set parallel.ac_skip_last=12
  ours 0,1 2 1b_auto_prefetch1 90 "${c[@]}" --set parallel.reshard_after_forward=auto --set parallel.fsdp_prefetch=1
  titan 0,1 2 1b_fsdp2_again 100 "${P1B[@]}" --fp8 none
  ours 0,1 2 1b_auto_again 90 "${c[@]}" --set parallel.reshard_after_forward=auto
}

vs_titan() {  # N NAME ARGS...: 1b FSDP2 on 2 GPUs, torchtitan then ours (NAME_1..N), N times interleaved
  local n=$1 name=$2 i
  shift 2
  for ((i = 1; i <= n; i++)); do
    titan 0,1 2 "1b_fsdp2_$i" 100 "${P1B[@]}" --fp8 none
    ours 0,1 2 "${name}_$i" 90 "$@"
  done
}

part_pw4() {
  note "pw4: 1b FSDP2 on 2 GPUs (fsdp_symm_mem=all, chunk 8192, reshard never, ac=pointwise on the first 4 blocks) against torchtitan, three times interleaved; never + pointwise on the first 5 blocks once"
  local c=(--strategy fsdp --fp8 none "${P1B[@]}" "${OURS[@]}" --set train.loss=chunked --set parallel.fsdp_symm_mem=all
    --set train.loss_chunk_tokens=8192 --set parallel.reshard_after_forward=never --ac pointwise)
  vs_titan 3 1b_never_pw4 "${c[@]}" --set parallel.ac_skip_last=12
  ours 0,1 2 1b_never_pw5 90 "${c[@]}" --set parallel.ac_skip_last=11
}

part_bsk() {
  note "bsk: 1b FSDP2 on 2 GPUs (fsdp_symm_mem=all, chunk 8192, reshard never): activation_memory_budget 0.999 on the first 4 blocks only (activation_memory_budget_skip_last=12) against torchtitan, three times interleaved; the first 5 / 6 blocks once"
  local c=(--strategy fsdp --fp8 none "${P1B[@]}" "${OURS[@]}" --set train.loss=chunked --set parallel.fsdp_symm_mem=all
    --set train.loss_chunk_tokens=8192 --set parallel.reshard_after_forward=never --set parallel.activation_memory_budget=0.999)
  vs_titan 3 1b_never_b4 "${c[@]}" --set parallel.activation_memory_budget_skip_last=12
  ours 0,1 2 1b_never_b5 90 "${c[@]}" --set parallel.activation_memory_budget_skip_last=11
  ours 0,1 2 1b_never_b6 90 "${c[@]}" --set parallel.activation_memory_budget_skip_last=10
}

part_bsk6() {
  note "bsk6: 1b FSDP2 on 2 GPUs (fsdp_symm_mem=all, chunk 8192, reshard never): activation_memory_budget 0.999 on the first 6 blocks (activation_memory_budget_skip_last=10) against torchtitan, three times interleaved; without the budget once"
  local c=(--strategy fsdp --fp8 none "${P1B[@]}" "${OURS[@]}" --set train.loss=chunked --set parallel.fsdp_symm_mem=all
    --set train.loss_chunk_tokens=8192 --set parallel.reshard_after_forward=never)
  vs_titan 3 1b_never_b6 "${c[@]}" --set parallel.activation_memory_budget=0.999 \
    --set parallel.activation_memory_budget_skip_last=10
  ours 0,1 2 1b_never_nobudget 90 "${c[@]}"
}

part_bsk6x2() {
  note "bsk6x2: PART=bsk6 twice instead of three times, without the run without the budget"
  vs_titan 2 1b_never_b6 --strategy fsdp --fp8 none "${P1B[@]}" "${OURS[@]}" --set train.loss=chunked \
    --set parallel.fsdp_symm_mem=all --set train.loss_chunk_tokens=8192 --set parallel.reshard_after_forward=never \
    --set parallel.activation_memory_budget=0.999 --set parallel.activation_memory_budget_skip_last=10
}
