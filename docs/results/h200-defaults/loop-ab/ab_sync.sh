#!/usr/bin/env bash
# old (the previous commit's train/ and core/ in .probe/old: a device sync each step) against new
# (the agreement read alone) at the same time on separate GPU pairs, then swapped; 8b and 1b bf16
# defaults. Run from the repository root on a machine of 4 GPUs; /tmp/ab must not exist yet.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 OMP_NUM_THREADS=8 PYTHONUNBUFFERED=1
root=$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
one() {  # name dir gpus port preset steps
  local name=$1 dir=$2 gpus=$3 port=$4 preset=$5 steps=$6
  (cd "$dir" && CUDA_VISIBLE_DEVICES=$gpus TORCHINDUCTOR_CACHE_DIR=/tmp/ind-$name-$gpus timeout -k 10 170 \
    python3 -m torch.distributed.run --nproc-per-node 2 --master-port "$port" --rdzv-backend static --node-rank 0 --nnodes 1 \
    -m train run --config "$preset" --steps "$steps" --set data.source=synthetic --set checkpoint.final=false \
    --set train.log_every=1 --out "/tmp/ab/$name" > "$OUT/$name.log" 2>&1; echo "$name rc $?")
}
med() {
  python3 - "/tmp/ab/$1/metrics.jsonl" "$1" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
v = [r["tokens_per_s_per_gpu"] for r in rows if "tokens_per_s_per_gpu" in r][4:]
print(sys.argv[2], "median tok/s/GPU", round(statistics.median(v)), "n", len(v), "peak", max(r.get("peak_mem_gib", 0) for r in rows))
PY
}
for p in 8b 1b; do
  s=16; if [ "$p" = 1b ]; then s=30; fi
  one "${p}_old_a" "$root/.probe/old" 0,1 29511 "$p" "$s" & one "${p}_new_a" "$root" 2,3 29522 "$p" "$s" & wait
  one "${p}_new_b" "$root" 0,1 29533 "$p" "$s" & one "${p}_old_b" "$root/.probe/old" 2,3 29544 "$p" "$s" & wait
  for n in old_a new_a old_b new_b; do med "${p}_$n"; done
  grep -h "plan:" "$OUT/${p}_new_a.log" | head -n 1
done
mkdir -p "$OUT/m"; for d in /tmp/ab/*; do cp "$d/metrics.jsonl" "$OUT/m/$(basename "$d").jsonl" 2>/dev/null; done
cd "$OUT" && tar czf ab.tgz ./*.log m && rm -rf m ./*.log
