#!/usr/bin/env bash
# One call on 2 GPUs: 1b FP8 defaults (the plan, float8 all-gathers, the reduce-scatter on NCCL) and
# torchtitan, 30 timed steps each, our run profiled (scripts/gpu/kernel_profile.py); then the 8b bf16
# defaults with the current code and with the previous commit (its train/ and core/ in .probe/old/).
# Carry .probe (with old/), .titan and .whl. Results: $OUT/t3.tgz.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8
root=$PWD; R=/tmp/t3; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$R/gpus.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
ours() {  # name dir limit preset steps sets...
  local name=$1 dir=$2 lim=$3 preset=$4 steps=$5; shift 5
  (cd "$dir" && PYTHONPATH=/tmp/site:$dir TORCHINDUCTOR_CACHE_DIR=/tmp/ind-$name timeout -k 10 "$lim" \
    python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m train run --config "$preset" --steps "$steps" \
    --set data.source=synthetic --set checkpoint.final=false --set train.log_every=1 "$@" --out "$R/$name" > "$R/$name.log" 2>&1
   echo "$name rc $?")
}
med() {
  python3 - "$R/$1/metrics.jsonl" "$1" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
v = [r["tokens_per_s_per_gpu"] for r in rows if "tokens_per_s_per_gpu" in r][4:]
print(sys.argv[2], "median", round(statistics.median(v)), "harm", round(len(v) / sum(1 / x for x in v)), "n", len(v),
      "peak", max(r.get("peak_mem_gib", 0) for r in rows))
PY
}
F8=(--set fp8.backend=torchao)
ours f8_plan "$root" 120 1b 34 "${F8[@]}"; med f8_plan
ours f8_ag8 "$root" 120 1b 34 "${F8[@]}" --set fp8.fsdp_float8_all_gather=true; med f8_ag8
ours f8_agonly "$root" 120 1b 34 "${F8[@]}" --set parallel.fsdp_symm_mem=all_gather; med f8_agonly
PYTHONPATH=$root/.titan/torchtitan-src:/tmp/site timeout -k 10 120 python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
  .titan/titan_bench.py --out "$R/titan_f8.json" --preset 1b --batch 4 --seq 2048 --compile on --ac none --fp8 tensorwise \
  --steps 30 --warmup 4 > "$R/titan_f8.log" 2>&1; echo "titan rc $?"
python3 -c "import json;d=json.load(open('$R/titan_f8.json'));print('titan f8', round(d['tokens_per_s_per_gpu']), [round(x*1000,1) for x in d['step_times_s_rank0']], d['peak_mem_gib'])"
PYTHONPATH=/tmp/site:$root TORCHINDUCTOR_CACHE_DIR=/tmp/ind-f8_plan timeout -k 10 120 python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
  scripts/gpu/kernel_profile.py --out "$R/prof" --name ours1bf8 --skip 10 --active 4 -- -m train run --config 1b --steps 16 \
  --set data.source=synthetic --set checkpoint.final=false --set train.log_every=1 "${F8[@]}" --out "$R/prof_run" > "$R/prof.log" 2>&1
echo "prof rc $?"; head -n 14 "$R/prof/ours1bf8.md" 2>/dev/null; grep -A 14 "GPU idle while" "$R/prof/ours1bf8.md" 2>/dev/null
ours ab8_new "$root" 150 8b 14; med ab8_new
ours ab8_old "$root/.probe/old" 150 8b 14; med ab8_old
cd $R && tar czf "$OUT/t3.tgz" --exclude='*/checkpoints' .
