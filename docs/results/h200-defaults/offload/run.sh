#!/bin/bash
# One H200 with most of its memory held by another process (a ballast leaving FREE_GIB free):
# the plan sees a small card. 3b's state (45 GiB) no longer fits, so the plan offloads it to the
# host; 8b's (120 GiB) fits neither the card nor the device machine's 126 GiB host: the run stops
# with one line before building the model. Writes into $OUT.
set -uo pipefail
source scripts/gpu/common.sh
: "${OUT:?set OUT to the results directory}"
FREE_GIB=${FREE_GIB:-40}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"
python3 - "$FREE_GIB" > "$OUT/ballast.log" 2>&1 <<'PY' &
import sys, time, torch
free, _ = torch.cuda.mem_get_info()
keep = int(float(sys.argv[1]) * 2**30)
x = torch.empty(free - keep, dtype=torch.uint8, device="cuda")
print(f"ballast {x.numel() / 2**30:.1f} GiB; free now {torch.cuda.mem_get_info()[0] / 2**30:.1f} GiB", flush=True)
time.sleep(3600)
PY
ballast=$!
for _ in $(seq 60); do grep -q "free now" "$OUT/ballast.log" && break; sleep 1; done
cat "$OUT/ballast.log"
{
  echo "== train run --config 3b (the defaults), $(date -u +%FT%TZ)"
  timeout 420 torchrun --nproc-per-node 1 -m train run --config 3b --steps 8 --set data.source=synthetic \
      --set checkpoint.final=false --set train.log_every=1 --out "$OUT/run_3b_g1"
  echo "rc=$?"
  echo "== train run --config 8b (the defaults), $(date -u +%FT%TZ)"
  timeout 120 torchrun --nproc-per-node 1 -m train run --config 8b --steps 2 --set data.source=synthetic \
      --set checkpoint.final=false --out "$OUT/run_8b_g1"
  echo "rc=$?"
} > "$OUT/log.txt" 2>&1
kill "$ballast"
wait "$ballast" 2>/dev/null
grep -v "^step \|^\[" "$OUT/log.txt" | tail -40
