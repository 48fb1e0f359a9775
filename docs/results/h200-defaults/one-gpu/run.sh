#!/bin/bash
# Every preset's defaults on one GPU: `train run --config P` with synthetic tokens and nothing
# else, a few steps each. `run.sh card`: the whole H200. `run.sh 80gb`: another process holds all
# but 77.19 GiB of it, so the plan sees what one H100 80GB leaves (79.19 GiB less 2 for this
# process's CUDA context and NCCL). Writes into $OUT: run_P_<which>/, log_<which>.txt, and the
# table (table_<which>.md) from table.py.
set -uo pipefail
source scripts/gpu/common.sh
: "${OUT:?set OUT to the results directory}"
which=${1:?card or 80gb}
case $which in
  card) presets=(125m gpt2-124m 350m 1b 3b 8b) ;;
  80gb) presets=(1b 3b 8b) ;;
  *) echo "run.sh: card or 80gb, not $which" >&2; exit 2 ;;
esac
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"
ballast=""
if [ "$which" = 80gb ]; then
  python3 - > "$OUT/ballast.log" 2>&1 <<'PY' &
import time, torch
free, _ = torch.cuda.mem_get_info()
x = torch.empty(free - int(77.19 * 2**30), dtype=torch.uint8, device="cuda")
print(f"ballast {x.numel() / 2**30:.2f} GiB; free now {torch.cuda.mem_get_info()[0] / 2**30:.2f} GiB", flush=True)
time.sleep(3600)
PY
  ballast=$!
  for _ in $(seq 60); do grep -q "free now" "$OUT/ballast.log" && break; sleep 1; done
  cat "$OUT/ballast.log"
fi
for p in "${presets[@]}"; do
  echo "== train run --config $p ($which), $(date -u +%FT%TZ)"
  timeout 300 torchrun --nproc-per-node 1 -m train run --config "$p" --steps 8 --set data.source=synthetic \
      --set checkpoint.final=false --set train.log_every=1 --set metrics.progress=false --out "$OUT/run_${p}_$which"
  echo "rc=$?"
done > "$OUT/log_$which.txt" 2>&1
[ -n "$ballast" ] && kill "$ballast"
python3 "$(dirname "$0")/table.py" "$OUT" "$which" | tee "$OUT/table_$which.md"
